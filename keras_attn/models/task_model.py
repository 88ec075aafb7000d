"""`TaskModel`: the base of the task heads built on a `Backbone` (classifiers, LMs)."""

import inspect

import keras

from keras_attn.models.model_config import ModelConfig


class TaskModel(ModelConfig, keras.Model):
    """A functional model that adds a task head to a `Backbone` it holds as `backbone`.

    Written once for the BERT and XLNet heads: `from_preset(name, *task_args,
    **task_and_backbone_arguments)`, which builds the backbone with
    `backbone_class.from_preset` and the head around it, and the config (`ModelConfig`:
    the backbone is serialized inside it).

    A subclass' `__init__` takes the backbone first, then its own arguments, stores
    them (`self.store_arguments(locals())` or `self.backbone = backbone`), and sets the
    class attributes below.

    Class attributes:
        backbone_class: the `Backbone` subclass `from_preset` builds.
        backbone_preset_arguments: dict, backbone arguments `from_preset` applies before
            the caller's overrides (`{"two_stream": True}` for a query-stream head).
    """

    backbone_class = None
    backbone_preset_arguments = {}

    @classmethod
    def from_preset(cls, name, *args, **kwargs):
        """The task model on `backbone_class.from_preset(name, **backbone_overrides)`.

        Keyword arguments that the task model's constructor takes (`num_classes`,
        `dropout`, ...) and positional arguments after `name` (in the constructor's
        order, after `backbone`) go to the head; the others override the backbone preset.

        Args:
            name: str, a preset of `backbone_class`.
            *args: the head's constructor arguments after `backbone`.
            **kwargs: the head's keyword arguments and backbone overrides.

        Raises:
            TypeError: a required argument of the head is missing (before any model is
                built).
            ValueError: `name` is not a preset of `backbone_class`.
        """
        head_arguments = cls.config_arguments()[1:]  # after `backbone`
        task_kwargs = {key: value for key, value in kwargs.items() if key in head_arguments}
        backbone_overrides = {key: value for key, value in kwargs.items()
                              if key not in head_arguments}
        # Fail on a missing head argument before building a backbone.
        inspect.signature(cls.__init__).bind(None, None, *args, **task_kwargs)
        backbone = cls.backbone_class.from_preset(
            name, **{**cls.backbone_preset_arguments, **backbone_overrides})
        return cls(backbone, *args, **task_kwargs)

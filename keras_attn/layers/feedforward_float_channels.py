"""`FeedforwardFloatChannels`: the feed-forward network of the int8 layout, its widest hidden
channels kept in float (LLM.int8()'s decomposition, Dettmers et al., 2022, §3.2), stored
last."""

import numpy as np
from keras import ops


class FeedforwardFloatChannels:
    """Mixed into `EncoderInt8Layout`: the feed-forward network of the layout (its int8
    channels, then its float ones), which channels are int8 and which float
    (`feedforward_float_channels`, the last ones), and their order. The host defines
    `_channel_axes()`, the `(variable, axis)` pairs a permutation moves together,
    `feedforward_channel_order`, the float order's position of each stored channel, and the
    layout's `_matmul`, `quantizers`, `activation` and `feedforward_dropout_layer`."""

    def _feedforward_parts(self):
        """`(channels, quantized)` of each part of the feed-forward network: the int8
        channels, then the `feedforward_float_channels` float ones (stored last)."""
        F, k = self.intermediate_dim, self.feedforward_float_channels
        if not k:
            return [(slice(None), True)]
        return [(slice(0, F - k), True), (slice(F - k, F), False)]

    def _int8_feedforward(self, x_int8, x, w, training):
        """`FFN` of the LayerNorm output: its int8 channels read `x_int8`, its float ones
        `x`; the parts' sum `(N, H)` after dropout."""
        h = None
        for part, (channels, quantized) in enumerate(self._feedforward_parts()):
            output = self._feedforward_part(x_int8 if quantized else x, part, channels,
                                            quantized, training, w)
            h = output if h is None else h + output  # (N, H)
        return self.feedforward_dropout_layer(h, training=training)

    def _feedforward_part(self, x, part, channels, quantized, training, w=None):
        q, w = self.quantizers, w or self._int8_weights()
        whole = not self.feedforward_float_channels
        kernel_in = (w["intermediate_kernel"] if whole
                     else w["intermediate_kernel"][:, channels])
        bias_in = w["intermediate_bias"] if whole else w["intermediate_bias"][channels]
        kernel_out = (w["feedforward_output_kernel"] if whole
                      else w["feedforward_output_kernel"][channels])
        if quantized:
            h = self._matmul(x, kernel_in, bias_in, "intermediate")  # (B*q, F - k)
        else:
            h = ops.matmul(x, kernel_in) + bias_in  # (B*q, k), on the float LayerNorm output
        if self.channel_statistics is not None:
            self.channel_statistics.update(part, h)
        if not quantized:
            # b_2 is added once, by the int8 part.
            h = self._feedforward_hidden_dropout(self.activation(h), training)
            return ops.matmul(h, kernel_out)  # (B*q, H)
        h = q["intermediate_quantizer"](h, training=training)
        h = q["activation_quantizer"](self.activation(h), training=training)
        h = self._feedforward_hidden_dropout(h, training)
        h = self._matmul(h, kernel_out, w["feedforward_output_bias"],
                         "feedforward_output")  # (B*q, H)
        return q["feedforward_output_quantizer"](h, training=training)

    def _feedforward_hidden_dropout(self, h, training):
        """Dropout on the feed-forward hidden activations: none (XLNet's block has one)."""
        return h

    def permute_feedforward_channels(self, order):
        """Reorders the feed-forward hidden channels: stored channel `i` becomes the one
        at `order[i]`. The block computes the same function (the up-projection's columns
        and the down-projection's rows move together); only which channels are the last
        `feedforward_float_channels`, the float ones, changes. Call it before the ranges
        are set.

        Args:
            order: a permutation of `range(intermediate_dim)`, e.g. the channels sorted
                by their calibrated range, widest last.
        """
        order = np.asarray(order)
        if sorted(order.tolist()) != list(range(self.intermediate_dim)):
            raise ValueError(
                f"`order` must be a permutation of range({self.intermediate_dim}) (the "
                f"feed-forward channels). Received: order of shape {order.shape}"
            )
        if not self.feedforward_float_channels:
            raise ValueError("Permuting the feed-forward channels only matters with "
                             "`feedforward_float_channels` > 0. Received: "
                             "feedforward_float_channels=0")

        for variable, axis in self._channel_axes() + [(self.feedforward_channel_order, 0)]:
            variable.assign(np.take(ops.convert_to_numpy(variable), order, axis=axis))

    def float_order_feedforward_weights(self):
        """`{path: NumPy value}` of the feed-forward weights back in the float model's
        channel order (what `permute_feedforward_channels` moved); `{}` without
        `feedforward_float_channels`."""
        if not self.feedforward_float_channels:
            return {}
        inverse = np.argsort(ops.convert_to_numpy(self.feedforward_channel_order))
        return {variable.path: np.take(ops.convert_to_numpy(variable), inverse, axis=axis)
                for variable, axis in self._channel_axes()}


class ChannelRanges:
    """Running per-channel min and max of the feed-forward up-projection output, part by
    part (eager calls only: the values are read as NumPy)."""

    def __init__(self):
        self._parts = {}

    def update(self, part, h):
        h = ops.convert_to_numpy(h)  # (N, channels of the part)
        low, high = h.min(axis=0), h.max(axis=0)
        if part in self._parts:
            low = np.minimum(low, self._parts[part][0])
            high = np.maximum(high, self._parts[part][1])
        self._parts[part] = (low, high)

    def widths(self):
        """`max - min` of every channel `(F,)`, in stored order."""
        if not self._parts:
            raise ValueError("No channel ranges were collected: run the block eagerly on "
                             "at least one batch first.")
        parts = [self._parts[p] for p in sorted(self._parts)]
        return np.concatenate([high - low for low, high in parts])

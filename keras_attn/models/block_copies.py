"""`block_copies` and `copy_block_weights`: the decoder blocks of a decoding-step graph
(`GPTCausalLM.decoder_step_model`, `Seq2SeqTransformer.encoder_model` and
`decoder_step_model`)."""


def block_copies(blocks):
    """Copies of `blocks` (from their configs) for a functional graph whose first call of
    each is its own: a functional model reads a layer's outputs by its first call, and the
    model's blocks were first called returning one tensor, not the cache too.
    `copy_block_weights` gives them the weights once that call has built them.

    Args:
        blocks: built layers (e.g. `TransformerDecoderBlock`s).

    Returns:
        A list of unbuilt layers of the same classes and configs.

    Example:
    >>> from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=8)
    >>> _ = block(np.zeros((1, 3, 4), "float32"))
    >>> [copy] = block_copies([block])
    >>> _ = copy(np.zeros((1, 3, 4), "float32"))
    >>> copy_block_weights([copy], [block])
    >>> x = np.random.default_rng(0).normal(size=(1, 3, 4)).astype("float32")
    >>> bool(np.allclose(copy(x), block(x)))
    True
    """
    return [type(block).from_config(block.get_config()) for block in blocks]


def copy_block_weights(copies, blocks):
    """The weights of `blocks` as they are now, into their built `block_copies`."""
    for copy, block in zip(copies, blocks):
        copy.set_weights(block.get_weights())

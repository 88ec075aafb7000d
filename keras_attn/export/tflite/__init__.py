"""TFLite: the converters (fixed-length, length-bucketed and multi-signature files; float,
float16, dynamic and full int8; in a child process), the metadata that makes a file
self-describing, and the runtimes that read files back (LiteRT, the translation and
generation files' decoding steps)."""

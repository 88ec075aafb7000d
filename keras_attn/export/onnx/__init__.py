"""ONNX: the converter (tf2onnx), dynamic, static and QDQ int8, the `metadata_props` that
make a file self-describing, and the runtimes on onnxruntime (`OnnxRunner`, the translation
encoder + decoder-with-past pair)."""

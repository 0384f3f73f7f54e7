"""The training-graph compiler: from an inference ONNX model to a standard-op training graph (loss and one
gradient output per trainable parameter) that onnxruntime runs on a device. It needs only onnx and numpy, so
neither the cloud's torch nor the server's flask comes with it (docs/training-graphs.md)."""

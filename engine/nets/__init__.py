"""The bundled default network (``*.onnx``) and its provenance (``*.json``, ``*.md``)."""

"""Graphs from elsewhere: graph files in our format or the published benchmarks' node-link
dialects (graph_import.py), ONNX models (onnx_import.py) and POET's problems (poet_import.py)."""

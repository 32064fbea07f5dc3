"""C and CUDA headers that generated code includes (shipped inside the wheel)."""

"""ffpa as an attention implementation of other libraries (each module imports its library on import)."""

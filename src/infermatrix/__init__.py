"""infermatrix: build, verify and publish a matrix of LLM-inference images."""
__version__ = "0.1.0"

"""hf-mirror: a self-hosted pull-through mirror of the Hugging Face Hub."""

__version__ = "0.1.0"

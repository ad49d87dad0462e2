"""``hf-mirror bench``: stream a dataset through an endpoint into a (GPU) training loop and measure it.

It loads data the way a training job does: ``datasets.load_dataset(..., streaming=True)``, an ``AutoTokenizer``
(loaded through the same endpoint) in a ``collate_fn``, a PyTorch ``DataLoader``, and batches moved to the device
from pinned memory with ``non_blocking=True``. Every measured pass runs in a fresh interpreter, because the HF
libraries read ``HF_ENDPOINT`` at import time: a *cold* pass with an empty ``HF_HOME``, then a *warm* pass with the
same ``HF_HOME`` again (tokenizer in the client cache, dataset files in the mirror's cache).

The parent side: :mod:`.command` (flags), :mod:`.bench` (the whole run), :mod:`.endpoint` (pre-flight and the
mirror's byte counter), :mod:`.passes` (one pass's interpreter), :mod:`.report` and :mod:`.plot`. The pass side:
:mod:`.worker` (``python -m mirror.harness --worker``, :mod:`.__main__`). :mod:`.protocol` is what both agree on.

This package talks HTTP only and is never imported by the server. See docs/harness.md for the meaning of each figure.
"""

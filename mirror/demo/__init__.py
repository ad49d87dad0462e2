"""Beside the house, over HTTP only: ``hf-mirror demo`` (:mod:`mirror.demo.command`) and the sample Hub it runs
(:mod:`mirror.demo.sample_hub`, ``python -m mirror.demo.sample_hub``). Neither imports the server's internals.
"""

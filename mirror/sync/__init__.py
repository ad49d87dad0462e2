"""``hf-mirror sync --manifest sync.toml``: pre-fetch a declared list of repos into the mirror's cache.

Two ways to reach the cache, one module each: ``--cache-dir DIR`` (the default, :mod:`.cache_dir_backend`: the
server's own parts, fill path and metadata, with pins) and ``--mirror URL`` (:mod:`.mirror_backend`: a running
mirror driven over HTTP, no pins). Both do what :mod:`.backend` asks; :mod:`.run` plans every (repo, revision) of
the :mod:`.manifest` (files chosen by :mod:`.selection`, listings by :mod:`.listings`) as :mod:`.jobs`, fetches
each missing blob once, reports through :mod:`.progress` and ends with :mod:`.summary`. The ``sync`` command's
flags and run are :mod:`mirror.cli.sync`.

Resumable (a fill resumes from the partial file an interrupted run left), idempotent (a second run fetches nothing
and says so), ``--dry-run`` lists what would be fetched. Exit code 1 when any repo failed, with its reason.
"""

"""Import and export of huggingface_hub client cache trees (``~/.cache/huggingface/hub``).

The client layout (one folder per repo)::

    {type}s--{ns}--{name}/blobs/<etag>                      the file bytes, named by the Hub etag
    {type}s--{ns}--{name}/snapshots/<commit>/<path>         relative symlink to ../../blobs/<etag>
    {type}s--{ns}--{name}/refs/<revision>                   the commit a branch or tag pointed to
    {type}s--{ns}--{name}/.no_exist/<commit>/<path>         a path known to be absent at the commit
    {type}s--{ns}--{name}/trees/<commit>.json               snapshot_download's complete listing of the commit

- :mod:`mirror.cache.hubcache.importer`: ``cache import``, a client cache into the mirror;
- :mod:`mirror.cache.hubcache.exporter`: ``cache export``, a repo of the mirror's cache as a client cache;
- :mod:`mirror.cache.hubcache.api_json`: the API JSON an import synthesises (info and tree listings);
- :mod:`mirror.cache.hubcache.layout`: the folder names, and a blob linked or copied into place.
"""

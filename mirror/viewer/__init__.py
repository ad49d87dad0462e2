"""The dataset viewer, cached (policy; no web framework here): :mod:`mirror.viewer.service` answers the viewer's host
and the Hub's parquet-conversion routes from the cache or upstream; :mod:`mirror.viewer.parquet_info` builds ``/info``
offline from cached parquet footers. The route that sends their answers is :mod:`mirror.routes.viewer`.
"""

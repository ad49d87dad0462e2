"""Blob storage backends behind one small interface (:class:`mirror.storage.base.BlobStore`)."""

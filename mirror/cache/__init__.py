"""The cache: its quota (manager), usage reports (usage), maintenance (verify, sweep, evict, pins), the scrub,
and the client-cache layout of ``cache import|export`` (hubcache)."""

from mirror.cache.maintenance import VerifyReport, repo_at_revision, repo_from_spec
from mirror.cache.manager import CacheManager, GcReport
from mirror.cache.scrub import Scrubber
from mirror.cache.usage import RepoUsage, UsageSnapshot
from mirror.errors import RepoPinned

__all__ = ["CacheManager", "GcReport", "RepoPinned", "RepoUsage", "Scrubber", "UsageSnapshot", "VerifyReport",
           "repo_at_revision", "repo_from_spec"]

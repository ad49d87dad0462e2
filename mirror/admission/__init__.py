"""The admission policy (issue 27): what the mirror lets through to its callers, per file.

- :mod:`mirror.admission.rules`: the ``policy_*`` settings as :class:`Rules`, the Hub's facts of a commit, and the
  decision for one file (publisher, licence, the Hub's scan, file type, the mirror's own scan), pure;
- :mod:`mirror.admission.scan`: the mirror's own scan of pickle-class files, allowlist-first, through zips;
- :mod:`mirror.admission.ledger`: scan verdicts per etag, the quarantine, the operator's releases, facts per commit;
- :mod:`mirror.admission.gate`: the decision with what is known now, and the refusal (``PolicyBlocked``, 403).

The service (:mod:`mirror.service.files`) asks the gate before any byte of a file leaves the mirror: resolve GET and
HEAD, the Xet CAS (by hash too), the sync and the warm, offline and stale answers. Listings stay as upstream has
them. Policy layer: no web framework, no HTTP client of its own (the Hub is asked through mirror.upstream).
"""

from mirror.admission.gate import AdmissionGate
from mirror.admission.ledger import Ledger
from mirror.admission.rules import Decision, RepoFacts, Rules, decide
from mirror.admission.scan import ScanVerdict, scan_bytes, scan_file

__all__ = ["AdmissionGate", "Decision", "Ledger", "RepoFacts", "Rules", "ScanVerdict", "decide", "scan_bytes",
           "scan_file"]

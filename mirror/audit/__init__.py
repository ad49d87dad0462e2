"""The audit log (issue 27): who took which file, when, and what the mirror decided; and each revision's bill of
materials.

    event      AuditEvent: one JSON line (time, caller, client, user agent, repo, revision, commit, path, etag,
               bytes, outcome, rule)
    session    Sessions: a client's requests for one file (resumes, Xet ranges) rolled up into one event
    log        AuditLog: appends events, one write(2) each before the answer's first byte; rotation
    recorder   FileNote (what a route says about the file it answers for), AuditRecorder (the event at the
               answer's start), decide() for the admission policy's refusals
    index      AuditIndex: SQLite over the files, for `hf-mirror audit --repo --path --caller --since`
    follower   IndexFollower: the server's background catch-up of the index
    sbom       the CycloneDX ML-BOM of a cached revision (`hf-mirror sbom REPO@REV`)

An edge of the house: it records what the routes answered and reports on it, as status/ does.
"""

from mirror.audit.event import AuditEvent
from mirror.audit.follower import IndexFollower
from mirror.audit.index import INDEX_NAME, AuditIndex, AuditQuery
from mirror.audit.log import AuditLog
from mirror.audit.recorder import AUDIT_NOTE, AUDIT_WHO, AuditRecorder, FileNote, caller_of, decide, note_file

__all__ = ["AUDIT_NOTE", "AUDIT_WHO", "INDEX_NAME", "AuditEvent", "AuditIndex", "AuditLog", "AuditQuery",
           "AuditRecorder", "FileNote", "IndexFollower", "caller_of", "decide", "note_file"]

"""The mirror's own scan of a pickle-class file, allowlist-first.

picklescan (a dependency; see pyproject) lists the globals a pickle stream imports: GLOBAL/INST, STACK_GLOBAL
through the memo, protocols 0 to 5, several pickles in one stream (the legacy torch format). The decision is the
mirror's, not picklescan's deny list: a file passes only when *every* global it names is on :data:`SAFE_GLOBALS`
(what ``torch.save`` and numpy write for tensors and arrays) or on the operator's extra list. A nested pickle
(``pickle.loads`` of bytes) names ``pickle.loads`` and fails like ``os.system`` or ``builtins.exec``.

A zip (``torch.save`` writes one) is read member by member, *whatever the member's name*: each member that parses as
a pickle is held to the same list (picklescan itself reads only members named like pickles or starting with a
protocol header, so a protocol 0 pickle in ``notes.txt`` would pass it). Zips inside zips are opened too.
"""

from __future__ import annotations

import io
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from picklescan.scanner import scan_numpy, scan_pickle_bytes

log = logging.getLogger("hf_mirror.admission")
logging.getLogger("picklescan").setLevel(logging.CRITICAL)  # its own log lines would repeat our verdict

# What torch.save / numpy write for tensors, storages and arrays (torch's own weights_only allowlist, in essence).
_TORCH_STORAGES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
                   "ComplexDouble", "ComplexFloat", "QUInt8", "QInt8", "QInt32", "QUInt4x2", "QUInt2x4", "Untyped")
_TORCH_DTYPES = ("float32", "float", "float64", "double", "float16", "half", "bfloat16", "int64", "long", "int32",
                 "int", "int16", "short", "int8", "uint8", "bool", "complex64", "complex128", "cfloat", "cdouble",
                 "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64", "qint8", "quint8", "qint32")
SAFE_GLOBALS: frozenset[str] = frozenset({
    "collections.OrderedDict", "collections.Counter", "builtins.set", "builtins.frozenset", "builtins.slice",
    "builtins.complex", "builtins.bytearray", "__builtin__.set", "_codecs.encode",
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_meta_tensor_no_storage",
    "torch._utils._rebuild_nested_tensor", "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._tensor._rebuild_from_type_v2", "torch.serialization._get_layout", "torch.Size", "torch.device",
    "torch.Tensor", "torch.nn.parameter.Parameter", "torch.strided", "torch.sparse_coo", "torch.per_tensor_affine",
    "torch.storage.UntypedStorage", "torch.storage.TypedStorage", "torch.UntypedStorage",
    *(f"torch.{kind}Storage" for kind in _TORCH_STORAGES), *(f"torch.{dtype}" for dtype in _TORCH_DTYPES),
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
})
_MAX_DEPTH = 3  # zips inside zips inside zips; deeper is refused, not followed
_MAGIC_NUMPY = b"\x93NUMPY"


_MAX_LINE = 1024 * 1024  # a protocol 0 argument line longer than this is not scanned: the file fails


class _Bounded(io.RawIOBase):
    """A stream as the pickle disassembler reads it, with two bounds: a read past the end fails at once (the
    unpickler could not read it either, so no pickle loads from there; without this, a length field in tensor bytes
    would make the scan read a whole member into memory), and an argument line longer than ``_MAX_LINE`` is noted
    (``overlong``) so that the file fails rather than passes unscanned."""

    def __init__(self, raw: IO[bytes], size: int) -> None:
        super().__init__()
        self.raw = raw
        self.size = size
        self.overlong = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def read(self, n: int = -1) -> bytes:
        if n is not None and n > 64 and n > self.size - self.raw.tell():  # a length field, not an opcode's bytes
            raise ValueError("a read past the end of the stream")
        return self.raw.read(n)

    def readline(self, limit: int | None = -1) -> bytes:
        line = self.raw.readline(_MAX_LINE)
        if len(line) >= _MAX_LINE and not line.endswith(b"\n"):
            self.overlong = True
            raise ValueError("an argument line too long to scan")
        return line


@dataclass(frozen=True)
class ScanVerdict:
    """``passed``: every pickle found names only allowed globals. ``findings``: what failed, e.g.
    ``archive/data.pkl: posix.system``."""

    passed: bool
    findings: tuple[str, ...]
    pickles: int  # pickle streams found (0: the file holds no pickle at all)

    @property
    def summary(self) -> str:
        if self.passed:
            return f"clean ({self.pickles} pickle(s), only allowed globals)"
        return "; ".join(self.findings[:8]) + (f" (+{len(self.findings) - 8} more)" if len(self.findings) > 8 else "")


class _Scan:
    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = allowed
        self.findings: list[str] = []
        self.pickles = 0

    def stream(self, data: IO[bytes], where: str, size: int, *, must_parse: bool) -> None:
        """One byte stream of ``size`` bytes: a zip (read member by member), numpy's format, or pickles."""
        head = data.read(8)
        data.seek(0)
        if head.startswith(b"PK") and not where:
            self.archive(data, where, 1)
            return
        bounded = _Bounded(data, size)
        if head.startswith(_MAGIC_NUMPY):
            result = scan_numpy(bounded, where)  # type: ignore[arg-type]
        else:
            result = scan_pickle_bytes(bounded, where)  # type: ignore[arg-type]
        if bounded.overlong:
            self.findings.append(f"{where or 'file'}: a pickle argument line over {_MAX_LINE} bytes (not scanned)")
        self.judge(result, where, must_parse=must_parse)

    def archive(self, data: IO[bytes], where: str, depth: int) -> None:
        if depth > _MAX_DEPTH:
            self.findings.append(f"{where}: zips nested deeper than {_MAX_DEPTH}")
            return
        try:
            with zipfile.ZipFile(data) as zf:
                for info in zf.infolist():
                    if info.is_dir():
                        continue
                    name = f"{where}:{info.filename}" if where else info.filename
                    # Every member, whatever its name: a payload may hide in "data/7" or "notes.txt". Read as a
                    # stream (a member holds GBs of tensor bytes: they fail to parse as a pickle at once).
                    with zf.open(info) as member:
                        if member.read(2) == b"PK":
                            member.seek(0)
                            self.archive(io.BytesIO(member.read()), name, depth + 1)
                        else:
                            member.seek(0)
                            self.stream(member, name, info.file_size, must_parse=False)
        except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError) as exc:
            self.findings.append(f"{where or 'zip'}: unreadable zip ({exc})")

    def judge(self, result: object, where: str, *, must_parse: bool) -> None:
        found = list(getattr(result, "globals", ()))
        if not found:
            if getattr(result, "scan_err", False) and must_parse:
                self.findings.append(f"{where or 'file'}: not a readable pickle")
            return  # no global: no callable to run (tensor bytes, text, a pickle of plain values)
        self.pickles += 1
        for g in found:
            name = f"{g.module}.{g.name}"
            if name not in self.allowed:
                self.findings.append(f"{where or 'file'}: {name}")


def scan_bytes(data: bytes, *, extra_globals: tuple[str, ...] = ()) -> ScanVerdict:
    scan = _Scan(SAFE_GLOBALS | frozenset(extra_globals))
    scan.stream(io.BytesIO(data), "", len(data), must_parse=False)
    return ScanVerdict(not scan.findings, tuple(scan.findings), scan.pickles)


def scan_file(path: Path | str, *, extra_globals: tuple[str, ...] = ()) -> ScanVerdict:
    """The verdict on one stored blob (read in a worker thread by the caller: it is synchronous)."""
    scan = _Scan(SAFE_GLOBALS | frozenset(extra_globals))
    try:
        with open(path, "rb") as f:
            scan.stream(f, "", os.fstat(f.fileno()).st_size, must_parse=False)
    except Exception as exc:  # noqa: BLE001 - a file the scanner cannot read is not known safe: it fails
        log.warning("scan of %s failed: %s", path, exc)
        scan.findings.append(f"scan failed: {type(exc).__name__}: {exc}")
    return ScanVerdict(not scan.findings, tuple(scan.findings), scan.pickles)

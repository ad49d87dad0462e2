"""Model files for the admission policy's tests, generated without torch: benign ``torch.save``-style state dicts
(a zip of ``archive/data.pkl`` + ``archive/data/N``, whose pickle names only the globals torch itself writes),
malicious pickles (``os.system`` through ``__reduce__``, ``builtins.exec``, a nested pickle, a payload hidden in a
zip member with another name, protocols 0 and 5), a safetensors file and a GGUF file.

Nothing here is ever unpickled: a malicious sample is built by *pickling* an object whose ``__reduce__`` names the
callable, which writes the opcodes without running anything.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import struct
import zipfile

# --- a tiny pickle assembler, for the torch opcodes (no torch here) ----------------------------------------------


def _str(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def _int(n: int) -> bytes:
    return b"K" + bytes([n]) if n < 256 else b"J" + struct.pack("<i", n)  # BININT1 / BININT


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"  # GLOBAL (what torch's protocol 2 writes)


def _tuple(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


def _tensor(key: int, storage: str, numel: int, shape: tuple[int, ...]) -> bytes:
    stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))  # contiguous
    persistent = _tuple(_str("storage"), _global("torch", storage), _str(str(key)), _str("cpu"), _int(numel))
    args = _tuple(persistent + b"Q",  # BINPERSID: the storage, loaded from archive/data/{key}
                  _int(0), _tuple(*map(_int, shape)), _tuple(*map(_int, stride)), b"\x89",  # NEWFALSE
                  _global("collections", "OrderedDict") + b")R")  # backward hooks: an empty OrderedDict
    return _global("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def state_dict_pickle(tensors: dict[str, tuple[int, ...]]) -> bytes:
    """The ``data.pkl`` torch writes for an OrderedDict of float tensors (protocol 2)."""
    out = b"\x80\x02" + _global("collections", "OrderedDict") + b")R("
    for key, (name, shape) in enumerate(tensors.items()):
        numel = 1
        for dim in shape:
            numel *= dim
        out += _str(name) + _tensor(key, "FloatStorage", numel, shape)
    return out + b"u."  # SETITEMS, STOP


def torch_zip(data_pkl: bytes, storages: list[bytes], *, root: str = "archive",
              extra: dict[str, bytes] | None = None) -> bytes:
    """A ``torch.save`` archive: ``{root}/data.pkl``, ``{root}/data/{i}``, ``{root}/version`` (+ ``extra``)."""
    members = {"data.pkl": data_pkl, "byteorder": b"little", **{f"data/{i}": d for i, d in enumerate(storages)},
               "version": b"3\n", **(extra or {})}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():  # a fixed date: the same bytes in every process that builds them
            zf.writestr(zipfile.ZipInfo(f"{root}/{name}", date_time=(2024, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def benign_state_dict(seed: int = 1) -> bytes:
    """A benign ``pytorch_model.bin``: two float tensors."""
    tensors = {"linear.weight": (2, 2), "linear.bias": (2,)}
    storages = [struct.pack("<4f", seed, 2, 3, 4), struct.pack("<2f", 0.5, seed)]
    return torch_zip(state_dict_pickle(tensors), storages)


# --- malicious pickles: the callable named by __reduce__, pickled (never loaded) -----------------------------------

class _Reduce:
    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.func, self.args


def reduce_pickle(func: object, *args: object, protocol: int = 2) -> bytes:
    return pickle.dumps(_Reduce(func, *args), protocol=protocol)


def os_system(protocol: int = 2) -> bytes:
    return reduce_pickle(os.system, "echo pwned > /tmp/hf-mirror-pwned", protocol=protocol)


def builtins_exec(protocol: int = 2) -> bytes:
    return reduce_pickle(exec, "import os; os.system('echo pwned')", protocol=protocol)


def nested_pickle() -> bytes:
    """``pickle.loads`` of an inner ``os.system`` pickle: the outer one names only ``_pickle.loads``."""
    return reduce_pickle(pickle.loads, os_system(), protocol=2)


def malicious_state_dict() -> bytes:
    """A torch zip whose ``data.pkl`` is the payload (``os.system`` in the state dict's place)."""
    return torch_zip(os_system(), [b"\0" * 16])


def hidden_member_zip() -> bytes:
    """A benign-looking torch zip: ``data.pkl`` is clean, the payload hides in a member named like tensor data."""
    storages = [struct.pack("<4f", 1, 2, 3, 4), struct.pack("<2f", 0.5, 1)]
    tensors = {"linear.weight": (2, 2), "linear.bias": (2,)}
    return torch_zip(state_dict_pickle(tensors), storages, extra={"data/7": builtins_exec(protocol=4),
                                                                   "notes.txt": os_system(protocol=0)})


# --- formats that are no pickle -----------------------------------------------------------------------------------

def safetensors_file(n: int = 8) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + struct.pack(f"<{n}f", *range(n))


def gguf_file() -> bytes:
    """A minimal GGUF v3 file: no tensors, one metadata key."""
    key, value = b"general.name", b"tiny"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv


BENIGN: dict[str, bytes] = {}
MALICIOUS: dict[str, bytes] = {}


def samples() -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(benign, malicious) by file name, as the emulator's ``acme/pickle-zoo`` serves them."""
    if not BENIGN:
        BENIGN.update({
            "pytorch_model.bin": benign_state_dict(1),
            "benign/ckpt.pt": torch_zip(state_dict_pickle({"w": (3,)}), [struct.pack("<3f", 1, 2, 3)],
                                        root="ckpt"),
            "benign/plain.pkl": state_dict_pickle({"w": (2,)}),  # a bare pickle (no zip) of the same globals
        })
        MALICIOUS.update({
            "evil/os_system.bin": malicious_state_dict(),
            "evil/os_system_p0.pkl": os_system(protocol=0),
            "evil/os_system_p5.pkl": os_system(protocol=5),
            "evil/exec.pt": torch_zip(builtins_exec(), [b"\0" * 16]),
            "evil/nested.pkl": nested_pickle(),
            "evil/hidden.pth": hidden_member_zip(),
        })
    return BENIGN, MALICIOUS

"""A compiled model saved and loaded whole: build here, deploy there (``CompiledModel.save``,
``tilefuse.load``, ``tilefuse compile --save``).

A package is a zip file (``.tfz``):

- ``manifest.json``: the format, the tilefuse, torch and Triton versions that built it, the target
  (name, GPU architecture), backend, strategy and the kernels' names;
- ``model.pkl``: the compiled model's parts as built (the imported graph and how to call it, the
  planned prim graph with its weights, the plan, its report and memory layout);
- ``kernels/<index>_<name>.py``: each kernel's source as generated (to read, and to check the load
  against);
- ``model.onnx``: the ONNX model it was compiled from, where there is one (``tilefuse run
  p.tfz --check`` compares with onnxruntime on it).

Loading plans nothing: it regenerates each kernel from its saved schedule (code generation, which
is deterministic; the result must equal the saved source) and runs as the saved model did. A
package from another tilefuse version, or for a GPU other than the one attached, is refused with
the reason. Kernels for a GPU are compiled by Triton on first use there (the binaries this
machine can compile, ``CompiledModel.native()``, are for reading, not shipped: the GPU machine's
Triton may differ). ``model.pkl`` is a pickle: load only packages you trust, as with
``torch.load``.
"""
from __future__ import annotations

import datetime
import json
import pickle
import zipfile
from pathlib import Path

FORMAT = 2      # 2: the memory plan keeps a persistent run's tensors apart
SUFFIX = ".tfz"


def save(compiled, path, *, onnx_model=None) -> Path:
    """Write ``compiled`` (a ``CompiledModel``) to ``path`` (module docstring); ``onnx_model``:
    the ONNX model it came from (a path, bytes or proto), kept for checking."""
    import torch
    import triton

    from .. import __version__
    path = Path(path)
    parts = {"imported": compiled.imported, "primgraph": compiled.primgraph, "plan": compiled.plan,
             "report": compiled.report, "memory": compiled.memory, "backend": compiled.backend,
             "target": compiled.target, "cuda_graph": compiled.cuda_graph, "persistent": compiled.persistent}
    manifest = {"format": FORMAT, "tilefuse": __version__, "torch": torch.__version__, "triton": triton.__version__,
                "target": compiled.target.name, "arch": compiled.target.arch, "backend": compiled.backend,
                "strategy": compiled.report.strategy, "kernels": [b.name for b in compiled.kernels],
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1) + "\n")
            z.writestr("model.pkl", pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL))
            width = len(str(max(len(compiled.kernels) - 1, 0)))
            for i, b in enumerate(compiled.kernels):
                z.writestr(f"kernels/{i:0{width}d}_{b.name}.{'py' if b.language == 'triton' else 'txt'}", b.source)
            if onnx_model is not None:
                z.writestr("model.onnx", _onnx_bytes(onnx_model))
    except OSError as e:
        from ..errors import TilefuseError
        raise TilefuseError(f"cannot write the package to {path}: {e.strerror or e}; give a path in an existing, "
                            f"writable folder") from None
    return path


def load(path):
    """The ``CompiledModel`` saved at ``path``; refused (``PackageError``) when another tilefuse
    version built it, when it is for a GPU other than the one attached, or when the file is not a
    package."""
    from .. import __version__
    from ..build import build_kernels
    from ..errors import PackageError
    from .compiled import CompiledModel
    path = Path(path)
    try:
        z = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise PackageError(f"{path}: no such file") from None
    except (OSError, zipfile.BadZipFile) as e:
        raise PackageError(f"{path}: not a tilefuse package ({e}); make one with CompiledModel.save or "
                           f"tilefuse compile --save") from None
    with z:
        try:
            manifest = json.loads(z.read("manifest.json"))
        except (KeyError, ValueError):
            raise PackageError(f"{path}: not a tilefuse package (no readable manifest.json)") from None
        if manifest.get("format") != FORMAT or manifest.get("tilefuse") != __version__:
            raise PackageError(f"{path} was built by tilefuse {manifest.get('tilefuse')} (package format "
                               f"{manifest.get('format')}); this is tilefuse {__version__} (format {FORMAT}): compile "
                               f"the model again with this version")
        _check_device(path, manifest)
        parts = pickle.loads(z.read("model.pkl"))
        sources = {n: z.read(n).decode() for n in z.namelist() if n.startswith("kernels/")}
    kernels = build_kernels(parts["plan"], parts["primgraph"])     # code generation only: no planning
    saved = [sources[k] for k in sorted(sources)]
    if [b.source for b in kernels] != saved:
        raise PackageError(f"{path}: the kernels generated from its plan differ from the ones it holds; the "
                           f"package is damaged or was edited: compile the model again")
    return CompiledModel(parts["imported"], parts["primgraph"], parts["plan"], parts["report"], parts["backend"],
                         parts["target"], kernels, cuda_graph=parts["cuda_graph"], memory=parts["memory"],
                         persistent=parts.get("persistent", ()))


def onnx_model(path) -> bytes | None:
    """The ONNX model a package was compiled from, if it holds one."""
    with zipfile.ZipFile(path) as z:
        return z.read("model.onnx") if "model.onnx" in z.namelist() else None


def is_package(path) -> bool:
    p = Path(path)
    return p.suffix == SUFFIX or (p.is_file() and zipfile.is_zipfile(p) and _has_manifest(p))


def _has_manifest(p: Path) -> bool:
    with zipfile.ZipFile(p) as z:
        return "manifest.json" in z.namelist()


def _check_device(path: Path, manifest: dict) -> None:
    """A GPU package loads on a machine without a GPU (to read and emulate it) or with that GPU,
    not with another one."""
    if not manifest.get("arch"):
        return
    import torch

    from ..cost.target import Target
    from ..errors import PackageError
    if not torch.cuda.is_available():
        return
    target = Target.get(manifest["target"].split(":")[0])     # (a detected device: "h100:<its name>")
    if not target.is_present():
        here = torch.cuda.get_device_properties(torch.cuda.current_device()).name
        raise PackageError(f"{path} holds kernels planned for {manifest['target']} (sm_{manifest['arch']}); this "
                           f"machine has {here}: compile the model for it (target='auto')")


def _onnx_bytes(model) -> bytes:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, Path)):
        return Path(model).read_bytes()
    return model.SerializeToString()

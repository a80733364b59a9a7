"""`python -m tokenswift.bench cpu-kind`: the suite's plan for each kind of CPU, its checks of --variants, and a
small suite run for real (its steps in their own processes, a failure reported and passed, a resumed run)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tokenswift.bench import cpu_kind as ck
from tokenswift.native import build

ROOT = Path(__file__).resolve().parents[1]
AMX = set(build.VARIANTS["amx"].cpu)
AVX512_BF16 = set(build.VARIANTS["avx512bf16"].cpu)  # an AMD Zen 4 / 5: AVX-512 with BF16, no AMX
AVX512 = set(build.VARIANTS["avx512"].cpu)
AVX2 = set(build.VARIANTS["avx2"].cpu)


def test_each_cpu_kind_gets_its_native_variant_and_the_ones_to_compare_it_with():
    assert ck.native_variant(AMX) == "amx" and ck.default_variants(AMX) == ["native", "avx2"]
    assert ck.native_variant(AVX512_BF16) == "avx512bf16"
    assert ck.default_variants(AVX512_BF16) == ["native", "avx2", "avx512"]
    assert ck.native_variant(AVX512) == "avx512"
    assert ck.default_variants(AVX512) == ["native", "avx2"]
    assert ck.default_variants(AVX2) == ["native"]
    assert ck.native_variant({"sse2"}) is None
    assert ck.runnable_variants(AVX512_BF16) == ["avx512bf16", "avx512", "avx2"]


def test_variants_are_checked_with_a_readable_message():
    assert ck.check_variants(["native", "avx512"], AMX) == ["native", "avx512"]
    with pytest.raises(ValueError, match="unknown kernel variant 'avx9'"):
        ck.check_variants(["avx9"], AMX)
    with pytest.raises(ValueError, match="cannot run the amx variant .*avx512bf16, avx512, avx2"):
        ck.check_variants(["amx"], AVX512_BF16)
    with pytest.raises(ValueError, match="named twice"):
        ck.check_variants(["avx2", "avx2"], AMX)


def test_the_plan_forces_each_variant_and_runs_smollm2_after_its_fetch():
    steps = ck.plan(["native", "avx2"], "runs/k", rounds=2)
    names = [s.name for s in steps]
    assert names[:4] == ["default-native-1024", "default-native-16000", "default-avx2-1024", "default-avx2-16000"]
    assert names[4:7] == ["fetch-smollm2", "smollm2-native-1024-hf", "smollm2-native-6000"]
    assert names[7:] == ["smollm2-rows-native-r1", "smollm2-rows-avx2-r1", "smollm2-rows-native-r2",
                         "smollm2-rows-avx2-r2"]  # alternated rounds
    by = {s.name: s for s in steps}
    assert by["default-native-1024"].env == {} and by["default-avx2-16000"].env == {"TOKENSWIFT_ISA": "avx2"}
    assert "--no-hf" in by["default-avx2-1024"].argv and "--no-hf" not in by["smollm2-native-1024-hf"].argv
    assert by["default-avx2-1024"].shell().startswith("TOKENSWIFT_ISA=avx2 python -m tokenswift.bench speed ")
    assert "--out-dir runs/k/default-avx2-1024" in by["default-avx2-1024"].shell()
    assert by["fetch-smollm2"].shell() == "python -m tokenswift fetch smollm2-135m"
    assert [s.name for s in ck.plan(["native"], "o", smollm2=False)] == ["default-native-1024",
                                                                          "default-native-16000"]


@pytest.fixture
def corpus(tmp_path):
    """A corpus folder of the seven files the prompts are cut from, each with a held-out part of ~100 tokens."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    line = "It was a fine morning, and Emma walked to Hartfield with her father and Mr. Knightley."
    for name in ("emma", "mansfield_park", "northanger_abbey", "persuasion", "pride_and_prejudice",
                 "sense_and_sensibility", "kjv"):
        (folder / f"{name}.txt").write_text("\n".join(f"{line} ({i})" for i in range(100)) + "\n")
    return folder


def test_a_summary_line_names_the_variant_and_tokenswifts_own_speed():
    """One `bench speed` result as a README row: the variant that ran (forced or not), AR's range, each sampling row's
    paired ratio and tokens per iteration, AR / HF, and TokenSwift's greedy speed to compare variants by."""
    def row(sampling: str, ar: float, ts: float, ratio: float, per_it: float, hf: float | None) -> dict:
        medians = {"ours-ar": {"tok_s": ar}, "tokenswift-auto": {"tok_s": ts},
                   "paired": {"ratio": ratio, "mean_accepted": per_it, "identical": sampling != "paper"}}
        return {"context": 1024, "sampling": sampling, "medians": medians,
                "ratios": {} if hf is None else {"ours-ar/hf-peer (wall)": hf}}

    results = {"conditions": {"kernel_variant": "avx2"},
               "rows": [row("greedy", 60.0, 92.5, 1.54, 2.14, 3.1), row("greedy+penalty", 61.0, 75.0, 1.32, 1.62, 3.3),
                        row("paper", 62.0, 63.0, 1.06, 1.1, None)]}
    step = ck.Step("default-avx2-1024", "speed", ("speed",), {"TOKENSWIFT_ISA": "avx2"}, variant="avx2")
    [line] = ck.speed_lines(step, results)
    assert line == ("| assets/default-model | avx2 (forced) | 1,024 | 60.0-62.0 | 1.54 (2.14/it) | 1.32 (1.62/it) | "
                    "1.06 (1.10/it) ≠AR | 3.10-3.30 | 92.5 |")


@pytest.mark.slow  # four benchmark processes on the shipped default model
def test_a_small_suite_runs_reports_a_failed_step_and_resumes(tmp_path, corpus, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "suite"
    steps = ck.plan(["native"], str(out), smollm2=False, tokens=12, contexts=(40, 64), corpus=str(corpus))
    rows = ck.Step("rows-native-r1", "rows", ("rows", "--model", ck.DEFAULT_MODEL, "--text", str(corpus / "emma.txt"),
                                               "--context", "40", "--rows", "1", "4", "--repeats", "2"))
    broken = ck.Step("fetch-nothing", "fetch", ("fetch", "no-such-model"), {}, ck.SMOLLM2)
    skipped = ck.Step("smollm2-after-a-failed-fetch", "speed", ("speed", "--model", ck.SMOLLM2), {}, ck.SMOLLM2)
    said: list[str] = []
    ended = ck.run_suite(steps + [rows, broken, skipped], out, say=said.append)

    for name in ("default-native-40", "default-native-64", "rows-native-r1"):
        assert ended[name].startswith("done in"), (name, ended[name], (out / f"{name}.log").read_text()[-2000:])
    assert ended["fetch-nothing"].startswith("failed (exit code")
    assert ended["smollm2-after-a-failed-fetch"].startswith("skipped: the fetch of smollm2-135m failed")
    results = json.loads((out / "default-native-64" / "results.json").read_text())
    assert results["conditions"]["kernel_variant"] == (ck.native_variant(build.cpu_flags()) if build.library() else None)
    assert [r["sampling"] for r in results["rows"]] == list(ck.SAMPLING_ROWS)
    summary = (out / "summary.md").read_text()
    lines = [ln for ln in summary.splitlines() if ln.startswith(f"| {ck.DEFAULT_MODEL} |")]
    assert [ln.split(" | ")[2] for ln in lines] == ["40", "64"]
    for ln in lines:  # every sampling row has its paired ratio and tokens per iteration, none differs from AR
        cells = ln.split(" | ")[4:7]
        assert all("/it)" in c and "≠" not in c for c in cells), ln
    assert "| native (" in summary and "SmolLM2-135M: one verified row and four" in summary
    progress = (out / "progress.txt").read_text()
    assert "default-native-40: started: python -m tokenswift.bench speed" in progress
    assert json.loads((out / "plan.json").read_text())[0]["shell"] == steps[0].shell()

    again = ck.run_suite(steps + [rows], out, say=said.append)  # resumed: nothing run twice
    assert set(again.values()) == {"kept from an earlier run"}


def test_the_command_refuses_a_variant_this_cpu_cannot_run(capsys, monkeypatch):
    from tokenswift.bench import cli

    monkeypatch.setattr(ck.build, "cpu_flags", lambda: set(AVX2))  # an AVX2-only CPU, whatever this one is
    assert cli.main(["cpu-kind", "--variants", "avx512", "--out-dir", "unused"]) == 2
    assert "error: this CPU cannot run the avx512 variant (it runs: avx2)" in capsys.readouterr().err
    assert not Path("unused").exists()

"""Trace files: the trace as a fold over Step events, export -> replay -> export byte for byte, refusal of
malformed files (one sentence each, nothing partial), the trace's lock, and cleanup of old exports."""
from __future__ import annotations

import copy
import json
import os
import random
import threading
import time
from dataclasses import replace

import pytest

import tokenswift as ts
from tokenswift.events import AcceptedToken, CacheState, Step, Timings, TreeNode
from tokenswift.kinds import DraftMode, KVMode, Method, Source
from tokenswift.serve import export
from tokenswift.serve.export import TraceFileError, load_trace_file, trace_to_json, write_trace_file
from tokenswift.serve.runner import RunRequest, interleave
from tokenswift.serve.trace import SERIES_CAP, TREES_KEPT, RunTrace

from conftest import random_heads, tiny_model

VOCAB = 256  # tiny_model's vocabulary
PROMPT = list(range(5, 40))
NEW = 60
RUNS = {  # more iterations than TREES_KEPT, so the kept trees and plans are a window of the run
    "paper": ts.Settings(kv_budget=32, kv_sink=4),  # dynamic partial cache: refreshes and held positions
    "fused": ts.Settings(draft=DraftMode.FUSED),
    "auto": ts.Settings(tree="auto", temperature=1.0),  # a plan every iteration; sampling
}


@pytest.fixture(scope="module")
def runs():
    """name -> (generator, trace, the Step events that built it)."""
    model = tiny_model("llama-gqa", seed=3)
    gen = ts.Generator(model, heads=random_heads(model))
    out = {}
    for name, settings in RUNS.items():
        trace = RunTrace(PROMPT, settings.to_dict(), NEW)
        steps = list(interleave(gen, RunRequest(PROMPT, settings, NEW, seed=1), threading.Event()))
        for step in steps:
            trace.add(step)
        out[name] = (gen, trace, steps)
    return out


def derived(trace: RunTrace) -> dict:
    """What the panes and plots read from both methods."""
    out = {}
    for m in Method:
        p = trace.pane(m)
        out[m] = dict(ids=p.token_ids, sources=p.sources, iterations=p.iterations, compute_s=p.compute_s,
                      prefill_s=p.prefill_s, totals=p.source_totals, hist=p.length_hist, refresh_at=p.refresh_at,
                      held=p.held_runs, budget=p.partial_budget, mode=p.partial_mode, length=p.cache_length,
                      done=p.done, plan=p.plan, accepted_per=list(p.per_iteration_accepted),
                      nodes=list(p.per_iteration_nodes), ms=list(p.per_iteration_ms),
                      trees=[(i, [n.token for n in nodes], acc) for i, nodes, acc in p.trees],
                      series={k: getattr(p, k).points() for k in ("accepted", "cache_len", "cache_mb", "partial_sink",
                                                                  "partial_selected", "partial_recent")})
    return out


# ---- the fold and the round trip ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RUNS))
def test_export_replay_export_is_byte_identical(runs, name, tmp_path):
    gen, trace, _ = runs[name]
    first = write_trace_file(trace, gen.decode, "tiny", directory=tmp_path)
    replayed, data = load_trace_file(first, vocab_size=VOCAB)
    second = write_trace_file(replayed, gen.decode, "tiny", directory=tmp_path)
    assert first != second
    assert open(first, "rb").read() == open(second, "rb").read()
    assert derived(replayed) == derived(trace)
    assert data["model"] == "tiny" and data["format"] == export.FORMAT
    assert replayed.tokenswift.generated == NEW and replayed.identical_prefix() == trace.identical_prefix()


def test_the_runs_exercise_what_the_trace_keeps(runs):
    """The round trips above cover refreshes, held positions, fused mode, plans and windows of trees."""
    paper, fused, auto = (runs[n][1].tokenswift for n in RUNS)
    assert paper.refresh_at and paper.held_runs and paper.partial_mode == KVMode.DYNAMIC
    assert fused.partial_mode == DraftMode.FUSED and not fused.refresh_at
    assert auto.plan and len(auto.events.plans) == TREES_KEPT
    assert all(t.iterations > TREES_KEPT and len(t.trees) == TREES_KEPT for t in (paper, fused, auto))


@pytest.mark.parametrize("name", list(RUNS))
def test_logged_events_rebuild_the_steps(runs, name):
    """Replay folds the Step events themselves: equal to the engine's, but for timings to the microsecond
    and for trees, plans and held positions outside the kept window."""
    _, trace, steps = runs[name]
    for method in Method:
        log = trace.pane(method).events
        original = [s for s in steps if s.method == method]
        kept_trees, kept_plans = {i for i, _ in log.trees}, {i for i, _ in log.plans}
        held_at = log.held[0] if log.held else -1
        for i, (was, again) in enumerate(zip(original, log.steps(method), strict=True)):
            expected = replace(was, timings=Timings(*(round(t * 1e6) / 1e6 for t in
                                                      (was.timings.draft_s, was.timings.verify_s, was.timings.bookkeeping_s))),
                               tree=was.tree if i in kept_trees else [], plan=was.plan if i in kept_plans else "",
                               cache=replace(was.cache, held_positions=was.cache.held_positions if i == held_at else None))
            assert again == expected


def synthetic_step(index: int, generated: int) -> Step:
    tokens = [AcceptedToken(7, Source.HEAD, 1), AcceptedToken(9, Source.BONUS, 2)]
    tree = [TreeNode(5, -1, 0, Source.ROOT, 1.0, True)] + [TreeNode(7, 0, 1, Source.HEAD, 0.5) for _ in range(8)]
    cache = CacheState(100 + generated, 10_000, 4096 * (100 + generated), KVMode.DYNAMIC, 64, 4, 40, index % 20,
                       refreshed=index % 20 == 0, refreshes=index // 20, held_positions=[(0, 4), (10, 50)])
    return Step(index, Method.TOKENSWIFT, tokens, cache, Timings(0.001, 0.002, 0.0001), generated, index * 0.003,
                0.5, tree, False, 8, f"8 nodes: plan {index}")


def test_memory_per_iteration_is_bounded():
    """A long run keeps tens of bytes per iteration: trees and plans of recent iterations, series capped."""
    trace = RunTrace([1, 2, 3], {}, 10**6)
    iterations = 6 * SERIES_CAP
    for i in range(iterations):
        trace.add(synthetic_step(i, 2 * (i + 1)))
    m = trace.tokenswift
    log = m.events
    assert len(m.trees) == len(log.trees) == len(log.plans) == TREES_KEPT
    assert all(len(getattr(m, s).x) <= SERIES_CAP for s in ("accepted", "cache_len", "partial_recent"))
    column_bytes = sum(c.itemsize * len(c) for c in log.columns.values()) + 4 * len(log.refreshed_at)
    assert column_bytes / iterations <= 64
    assert log.depths.itemsize <= 2 and sum(len(c.points) for c in log.changes.values()) < iterations // 10


# ---- old files ---------------------------------------------------------------------------------------------
def test_a_trace_from_before_the_fold_is_refused_with_one_sentence(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "tokenswift-live-trace/1", "model": "tiny", "prompt_ids": [1, 2],
                                "settings": {}, "max_new_tokens": 5, "ar": {}, "tokenswift": {}}))
    with pytest.raises(TraceFileError, match="old format 'tokenswift-live-trace/1'.*export the run again") as err:
        load_trace_file(path)
    assert_one_sentence(str(err.value))


# ---- malformed files ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def valid(runs) -> dict:
    gen, trace, _ = runs["paper"]
    return json.loads(json.dumps(trace_to_json(trace, gen.decode, "tiny")))


def assert_one_sentence(message: str) -> None:
    assert "\n" not in message and "Traceback" not in message and len(message) < 300
    assert message[0].isupper() and message.endswith(".") and message.count(". ") == 0, message


def changed(edit):
    """A case built from the valid file: `edit(data)` changes a copy of it in place."""
    def build(data):
        data = copy.deepcopy(data)
        edit(data)
        return json.dumps(data)
    return build


def rewritten(edit):
    """A case built from the valid file: `edit(data)` returns the text to write."""
    return lambda data: edit(copy.deepcopy(data))


def ts_log(data):
    return data["methods"]["tokenswift"]


def set_path(data, keys, value):
    *parents, last = keys
    for k in parents:
        data = data[k]
    data[last] = value


def with_literal(keys, literal):
    """A number replaced by a bare JSON literal (Infinity, NaN, 1e999) that json.dumps would not write."""
    def edit(data):
        set_path(data, keys, "@@")
        return json.dumps(data).replace('"@@"', literal)
    return edit


ELAPSED = ["methods", "tokenswift", "per_iteration", "elapsed_s", 0]
MALFORMED = {  # name -> (file text from the valid file, expected message, load_trace_file keywords)
    "over the size limit": (changed(lambda d: None), r"MiB; at most 0\.0 MiB", dict(max_bytes=1000)),
    "not JSON": (lambda d: "{'format': 'tokenswift-live-trace/2'", "not valid JSON", {}),
    "not UTF-8": (lambda d: b"\xff\xfe{}", "not UTF-8", {}),
    "a list at the top": (lambda d: "[1, 2, 3]", "top level is not a JSON object", {}),
    "wrong format": (changed(lambda d: d.update(format="someone-else/9")), "not a TokenSwift Live trace", {}),
    "Infinity": (rewritten(with_literal(ELAPSED, "Infinity")), "contains Infinity", {}),
    "NaN": (rewritten(with_literal(ELAPSED, "NaN")), "contains NaN", {}),
    "huge float": (rewritten(with_literal(ELAPSED, "1e999")), "1e999, which is out of range", {}),
    "huge integer": (rewritten(with_literal(["max_new_tokens"], "1" * 400)), "max_new_tokens must be a whole number from 1 to .*; got a number of 400 digits", {}),
    "an integer past Python's digit limit": (rewritten(with_literal(["max_new_tokens"], "1" * 5000)), "thousands of digits", {}),
    "deep nesting": (lambda d: "[" * 100_000 + "]" * 100_000, "nests lists or objects too deeply", {}),
    "duplicate key": (rewritten(lambda d: json.dumps(d)[:-1] + ', "model": "other"}'), "key 'model' twice", {}),
    "negative token id": (changed(lambda d: ts_log(d)["tokens"]["ids"].__setitem__(3, -1)),
                          r"methods\.tokenswift\.tokens\.ids\[3\] must be a whole number from 0 to 255; got -1\.", {}),
    "token id beyond the vocabulary": (changed(lambda d: d["prompt_ids"].__setitem__(0, VOCAB)),
                                       r"prompt_ids\[0\] must be a whole number from 0 to 255; got 256\.", {}),
    "unknown source": (changed(lambda d: ts_log(d)["tokens"]["sources"].__setitem__(0, "oracle")),
                       r"sources\[0\] must be one of head, ngram, .*; got 'oracle'\.", {}),
    "empty per_iteration with tokens": (
        changed(lambda d: ts_log(d).update(per_iteration={k: [] for k in ts_log(d)["per_iteration"]})),
        "add up to 0 but there are 60 tokens", {}),
    "unknown series key": (changed(lambda d: ts_log(d).update(series={"accepted": {"x": [], "y": []}})),
                           "methods.tokenswift has the unknown key 'series'", {}),
    "unknown top-level key": (changed(lambda d: d.update(extra=1)), "the file has the unknown key 'extra'", {}),
    "missing key": (changed(lambda d: ts_log(d).pop("done")), "methods.tokenswift lacks the key 'done'", {}),
    "text for a number": (changed(lambda d: d.update(max_new_tokens="60")), "max_new_tokens must be a number: a whole one from 1 to .*; got '60'\.", {}),
    "3.0 for a whole number": (changed(lambda d: d["prompt_ids"].__setitem__(0, 5.0)),  # kept as read: no 3.0 -> 3
                               r"prompt_ids\[0\] must be a whole number from 0 to 255; got 5\.0\.", {}),
    "true for a number": (changed(lambda d: ts_log(d)["per_iteration"]["accepted"].__setitem__(0, True)),
                          r"accepted\[0\] must be a number: a whole one from 0 to .*; got True\.", {}),
    "object for a list": (changed(lambda d: d.update(prompt_ids={"0": 5})), "prompt_ids must be a list; got a value of type dict\.", {}),
    "too many tree nodes": (changed(lambda d: ts_log(d)["trees"][0][1].extend([ts_log(d)["trees"][0][1][-1]] * 5000)),
                            "nodes has .* entries; at most 4,096 are allowed", {}),
    "more drafted nodes than allowed": (changed(lambda d: None), r"draft_nodes\[0\] must be a whole number from 0 to 4; got 40\.",
                                        dict(max_tree_nodes=4)),
    "list longer than allowed": (changed(lambda d: None), "prompt_ids has 35 entries; at most 20", dict(max_tokens=20)),
    "more tokens than max_new_tokens": (changed(lambda d: d.update(max_new_tokens=10)),
                                        "60 tokens but max_new_tokens is 10", {}),
    "sources shorter than ids": (changed(lambda d: ts_log(d)["tokens"]["sources"].pop()), "59 entries for 60 tokens", {}),
    "a column shorter than the others": (changed(lambda d: ts_log(d)["per_iteration"]["verify_us"].pop()),
                                         "verify_us has .* entries for .* iterations", {}),
    "a tree node that is its own parent": (changed(lambda d: ts_log(d)["trees"][0][1][2].update(parent=2)),
                                           "node 2 parent must be a whole number from -1 to 1; got 2\.", {}),
    "a probability above 1": (changed(lambda d: ts_log(d)["trees"][0][1][1].update(draft_prob=2.5)),
                              "draft_prob must be a number from 0 to 1; got 2.5\.", {}),
    "a tree past the last iteration": (changed(lambda d: ts_log(d)["trees"][-1].__setitem__(0, 10**6)),
                                       r"trees\[31\] iteration must be a whole number from 0 to \d+; got 1000000\.", {}),
    "trees out of order": (changed(lambda d: ts_log(d)["trees"].reverse()), "but iterations must increase", {}),
    "unknown partial mode": (changed(lambda d: ts_log(d)["changes"]["partial_mode"][0].__setitem__(1, "magic")),
                             "partial_mode\\[0\\] must be one of none, fused, full, .*; got 'magic'\\.", {}),
    "unknown setting": (changed(lambda d: d["settings"].update(speed="max")), "settings has the unknown key 'speed'", {}),
    "a setting of the wrong kind": (changed(lambda d: d["settings"].update(temperature="hot")),
                                    "settings.temperature must be a number: from -1,000,000,000 to 1,000,000,000; got 'hot'\.", {}),
    "an empty held run": (changed(lambda d: ts_log(d)["held"][1].__setitem__(0, [5, 5])), "run 0 end must be a whole number from 6 to .*; got 5\.", {}),
    "an unknown method": (changed(lambda d: d["methods"].update(medusa={})), "methods has the unknown key 'medusa'", {}),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_files_are_refused_with_one_clear_sentence(valid, tmp_path, case):
    build, message, keywords = MALFORMED[case]
    content = build(valid)
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(TraceFileError, match=message) as err:
        load_trace_file(path, **{"vocab_size": VOCAB, **keywords})
    assert_one_sentence(str(err.value))


def test_the_valid_file_behind_the_malformed_cases_loads(valid, tmp_path):
    path = tmp_path / "good.json"
    path.write_text(json.dumps(valid))
    trace, _ = load_trace_file(path, vocab_size=VOCAB)
    assert trace.tokenswift.generated == NEW


def test_random_damage_is_refused_cleanly_or_harmless(valid, tmp_path):
    """Any leaf replaced by a value of another kind: the file loads, or TraceFileError says why; nothing else."""
    rng = random.Random(0)
    leaves = []

    def collect(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                collect(v, path + [k])
        elif isinstance(node, list) and node:
            for k in {0, len(node) - 1}:
                collect(node[k], path + [k])
        else:
            leaves.append(path)

    collect(valid, [])
    text = json.dumps(valid)
    junk = [-1, 0, 1, 2**40, 0.5, -0.5, "", Source.HEAD, None, True, [], {}, [1, 2], 255, 256]
    refused = 0
    for attempt in range(150):
        data = json.loads(text)
        set_path(data, rng.choice(leaves), rng.choice(junk))
        path = tmp_path / f"damaged-{attempt}.json"
        path.write_text(json.dumps(data))
        try:
            load_trace_file(path, vocab_size=VOCAB)
        except TraceFileError as exc:
            assert_one_sentence(str(exc))
            refused += 1
    assert refused > 75


# ---- the lock ----------------------------------------------------------------------------------------------
def test_exports_never_see_a_half_added_step(runs):
    """A writer adds events while exports are taken: every snapshot holds whole steps only."""
    _, _, steps = runs["paper"]
    trace = RunTrace(PROMPT, {}, 10**6)
    done = threading.Event()

    def writer():
        index = {m: 0 for m in Method}
        for _ in range(15):
            for step in steps:
                trace.add(replace(step, index=index[step.method], done=False))
                index[step.method] += 1
        done.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    snapshots = 0
    try:
        while not done.is_set() or snapshots == 0:
            snap = trace.snapshot()
            snapshots += 1
            for method, log in snap["methods"].items():
                tokens, per = log["tokens"], log["per_iteration"]
                assert len(tokens["ids"]) == len(tokens["sources"]) == len(tokens["depths"]) == sum(per["accepted"])
                assert {len(column) for column in per.values()} == {len(per["accepted"])}
                assert snap["readable"]["methods"][method]["generated"] == len(tokens["ids"])
    finally:
        thread.join()
    assert trace.tokenswift.iterations == 15 * sum(s.method == Method.TOKENSWIFT for s in steps)


# ---- the export folder -------------------------------------------------------------------------------------
def test_old_export_files_are_removed_by_age_and_by_count(runs, tmp_path):
    gen, trace, _ = runs["fused"]
    now = time.time()
    stale = tmp_path / "tokenswift-run-stale.json"
    stale.write_text("{}")
    os.utime(stale, (now - 7200, now - 7200))
    recent = []
    for k in range(6):
        path = tmp_path / f"tokenswift-run-recent{k}.json"
        path.write_text("{}")
        os.utime(path, (now - 600 + k, now - 600 + k))  # recent0 is the oldest
        recent.append(path)
    other = tmp_path / "notes.json"
    other.write_text("{}")
    os.utime(other, (now - 7200, now - 7200))
    new = write_trace_file(trace, gen.decode, "tiny", directory=tmp_path, keep=4, max_age_s=3600)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([os.path.basename(new), "notes.json", *(p.name for p in recent[-3:])])


def test_exports_go_to_one_private_folder_by_default(runs, tmp_path, monkeypatch):
    gen, trace, _ = runs["fused"]
    folder = tmp_path / "exports"
    monkeypatch.setattr(export, "EXPORT_DIR", folder)
    path = write_trace_file(trace, gen.decode, "tiny")
    assert os.path.dirname(path) == str(folder) and os.path.basename(path).startswith(export.FILE_PREFIX)
    assert folder.stat().st_mode & 0o077 == 0 and os.stat(path).st_mode & 0o077 == 0


def test_the_vocabulary_can_follow_the_model_the_file_names(valid, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(valid))
    asked = []
    load_trace_file(path, vocab_size=lambda model: asked.append(model) or VOCAB)
    assert asked == ["tiny"]
    with pytest.raises(TraceFileError, match=r"prompt_ids\[0\] must be a whole number from 0 to 4; got 5\."):
        load_trace_file(path, vocab_size=lambda model: 5)

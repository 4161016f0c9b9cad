"""Profiles are filed by checkpoint name (``profiles/<target>__<draft name>/...``); the weights they were measured
with are recorded by fingerprint (``measured.weights``) so that ``run/a/checkpoint-1000`` and
``run/b/checkpoint-1000`` never share an acceptance profile unnoticed."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from tiny_pair import byte_tokenizer, noisy_copy, random_model  # noqa: E402

from sequoia_opt.errors import CheckpointError, TreeoptError  # noqa: E402
from sequoia_opt.jobs.load import check_default_profile, parse_drafter_spec, weights_record  # noqa: E402
from sequoia_opt.model.hf import save_hf_checkpoint  # noqa: E402
from sequoia_opt.model.loaders import FINGERPRINT_SAMPLE_BYTES, FINGERPRINT_SAMPLES, weights_fingerprint  # noqa: E402
from sequoia_opt.profiles import weights_mismatch, warn_on_mismatch  # noqa: E402
from sequoia_opt.profiles.acceptance import AcceptanceProfile  # noqa: E402


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two trainings of one architecture saved under one folder name in two runs, and a copy of the first."""
    root = tmp_path_factory.mktemp("ckpts")
    tok = byte_tokenizer()
    target = random_model(0)
    save_hf_checkpoint(target, tok, root / "target")
    a, b = root / "a" / "checkpoint-1000", root / "b" / "checkpoint-1000"
    save_hf_checkpoint(noisy_copy(target, 0.05, 1), tok, a)
    save_hf_checkpoint(noisy_copy(target, 0.05, 2), tok, b)
    copy = root / "moved" / "checkpoint-1000"
    shutil.copytree(a, copy)
    return root / "target", a, b, copy


def test_two_checkpoints_of_one_name_differ_and_a_copy_matches(checkpoints):
    target, a, b, copy = checkpoints
    fa, fb, fc = weights_fingerprint(a), weights_fingerprint(b), weights_fingerprint(copy)
    assert fa.startswith("sha256:") and len(fa) == len("sha256:") + 16
    assert fa != fb and fa == fc and weights_fingerprint(target) not in (fa, fb)
    # touching a file (a new modification time) with the same bytes keeps the fingerprint
    weights = next(copy.glob("*.safetensors"))
    os.utime(weights, (1, 1))
    assert weights_fingerprint(copy) == fa


def test_a_single_file_is_fingerprinted_by_its_bytes_not_its_name(tmp_path):
    big = FINGERPRINT_SAMPLE_BYTES * FINGERPRINT_SAMPLES * 3  # sampled, not read whole
    data = bytearray(os.urandom(big))
    one, renamed = tmp_path / "model.gguf", tmp_path / "other-name.gguf"
    one.write_bytes(data)
    renamed.write_bytes(data)
    assert weights_fingerprint(one) == weights_fingerprint(renamed)
    data[0] ^= 1  # the first byte is always sampled
    one.write_bytes(data)
    assert weights_fingerprint(one) != weights_fingerprint(renamed)
    data[0] ^= 1
    data[-1] ^= 1  # and so is the last
    one.write_bytes(data)
    assert weights_fingerprint(one) != weights_fingerprint(renamed)


def test_a_folder_without_weights_or_a_missing_path_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no weight file"):
        weights_fingerprint(tmp_path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        weights_fingerprint(tmp_path / "absent")


def test_weights_record_names_a_drafters_own_checkpoint_only(checkpoints):
    target, a, _, _ = checkpoints
    rec = weights_record(target, parse_drafter_spec(str(a)))
    assert rec == {"target": {"path": str(target.resolve()), "fingerprint": weights_fingerprint(target)},
                   "draft": {"path": str(a.resolve()), "fingerprint": weights_fingerprint(a)}}
    assert set(weights_record(target, parse_drafter_spec("self:1"))) == {"target"}  # the target's weights
    assert set(weights_record(target, parse_drafter_spec("lookup"))) == {"target"}


def test_weights_mismatch_compares_fingerprints_both_sides_know(checkpoints):
    target, a, b, copy = checkpoints
    ra, rb, rc = (weights_record(target, parse_drafter_spec(str(p))) for p in (a, b, copy))
    assert weights_mismatch({"weights": ra}, ra) == [] and weights_mismatch({"weights": ra}, rc) == []  # a copy
    [msg] = weights_mismatch({"weights": ra}, rb)
    assert msg.startswith(f"its draft weights at {a.resolve()}") and str(b.resolve()) in msg
    assert weights_mismatch({}, rb) == [] and weights_mismatch({"weights": ra}, None) == []  # unknown: not compared
    assert weights_mismatch({"weights": {"target": ra["target"]}}, rb) == []  # no draft recorded
    acc = AcceptanceProfile.from_dict({"format": "treeopt-acceptance/1", "id": "x", "acceptance": [0.5],
                                       "measured": {"draft": "checkpoint-1000", "weights": ra}}, source="x")
    [w] = warn_on_mismatch(acceptance=acc, draft="checkpoint-1000", weights=rb)
    assert w.startswith("profile 'x' was measured with other weights: its draft weights")
    assert warn_on_mismatch(acceptance=acc, draft="checkpoint-1000", weights=rc) == []


def _profile_at(path: Path, weights: dict | None) -> str:
    doc = {"format": "treeopt-acceptance/1", "id": "x", "acceptance": [0.5],
           "measured": {"draft": "checkpoint-1000", **({"weights": weights} if weights else {})}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path.read_text()


def test_a_default_path_holding_another_checkpoints_profile_is_not_replaced(tmp_path, checkpoints):
    target, a, b, copy = checkpoints
    ra, rb, rc = (weights_record(target, parse_drafter_spec(str(p))) for p in (a, b, copy))
    path = tmp_path / "profiles" / "target__checkpoint-1000" / "acceptance-greedy.yaml"
    _profile_at(path, ra)
    with pytest.raises(TreeoptError, match=r"holds the profile of the draft at .*a/checkpoint-1000.*-o PATH"):
        check_default_profile(path, rb)
    check_default_profile(path, rc)  # the same weights elsewhere (a copy): re-profiling replaces it
    retrained = {**ra, "draft": {**ra["draft"], "fingerprint": "sha256:0000000000000000"}}
    check_default_profile(path, retrained)  # the same path, new weights: re-profiling replaces it
    _profile_at(path, None)
    check_default_profile(path, rb)  # a profile that records no weights is not compared
    path.write_text(": not yaml [")
    check_default_profile(path, rb)
    check_default_profile(tmp_path / "absent.yaml", rb)


def test_a_tree_solved_for_other_weights_warns_when_run(checkpoints):
    from sequoia_opt.jobs.entries import tree_mismatch_warnings
    from sequoia_opt.tree import TreeMetadata

    target, a, b, copy = checkpoints
    ra, rb, rc = (weights_record(target, parse_drafter_spec(str(p))) for p in (a, b, copy))
    meta = TreeMetadata(budget=4, max_depth=2, extra={"profiled_draft": "checkpoint-1000", "profiled_weights": ra})
    kw = dict(device="cpu", dtype="float32", target="target", draft="checkpoint-1000")
    [w] = tree_mismatch_warnings("t", meta, weights=rb, **kw)
    assert w.startswith("tree 't' was solved from an acceptance profile measured with other weights: its draft "
                        f"weights at {a.resolve()}") and w.endswith("its predicted figures describe that checkpoint")
    assert tree_mismatch_warnings("t", meta, weights=rc, **kw) == []
    assert tree_mismatch_warnings("t", TreeMetadata(budget=4, max_depth=2), weights=rb, **kw) == []


def test_a_calibration_of_other_weights_is_said(tmp_path, checkpoints):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_dynamic_cli import _calibration

    from sequoia_opt.profiles.calibration import calibration_warnings, load_calibration

    target, a, b, copy = checkpoints
    ra, rb, rc = (weights_record(target, parse_drafter_spec(str(p))) for p in (a, b, copy))
    f = _calibration(tmp_path / "cal.yaml")
    doc = yaml.safe_load(f.read_text())
    doc["measured"]["weights"] = ra
    f.write_text(yaml.safe_dump(doc))
    cal = load_calibration(f)
    other = [w for w in calibration_warnings(cal, weights=rb) if "other weights" in w]
    assert len(other) == 1 and other[0].startswith("calibration profile 'tiny_calibration' was recorded with other "
                                                   f"weights: its draft weights at {a.resolve()}")
    assert not [w for w in calibration_warnings(cal, weights=rc) if "other weights" in w]

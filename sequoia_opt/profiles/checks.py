"""Cross-checks of the profiles a command is given: were they measured on this device, in this precision, for this
pair, these weights (:func:`warn_on_mismatch`, :func:`weights_mismatch`)? One warning line each; nothing is refused
here (a command that picks a profile by its default path refuses another checkpoint's weights itself)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from .acceptance import AcceptanceProfile
from .latency import LatencyCurve

# ---------------------------------------------------------------------------------------------- mismatch
_DEVICE_TYPE = re.compile(r"(cpu|cuda|mps|xpu|hip)(:\d+)?")


def same_device(recorded: Any, name: Any, device_type: str | None = None) -> bool:
    """Whether a profile's recorded device is the device ``name`` (of torch type ``device_type``). Profiles
    record the device's name (``sequoia_opt.device.device_name``: the CPU model, the GPU's name); files
    written before acceptance profiles did hold its type (``cpu``, ``cuda:0``), which matches every device of
    that type (one device, one name: "cpu" and "AMD EPYC 7B13" are the same machine). Names compare without
    case or surrounding blanks.
    """
    r, n = str(recorded).strip().lower(), str(name).strip().lower()
    r_type, n_type = _DEVICE_TYPE.fullmatch(r), _DEVICE_TYPE.fullmatch(n)
    if r_type and n_type:
        return r_type.group(1) == n_type.group(1)
    if r_type:
        return device_type is None or r_type.group(1) == device_type.strip().lower().split(":")[0]
    if n_type:
        return True  # the caller knows only the type: a name cannot be told apart from it
    return r == n


def measured_differs(label: str, have: Any, want: Any, device_type: str | None = None) -> bool:
    """Whether a profile's recorded ``label`` value ``have`` (``device``, ``dtype``, ``target``, ``draft``)
    differs from ``want``, the value in use: ``False`` when either is unknown (None); devices compare by
    :func:`same_device`, the rest as text without case or surrounding blanks. The one rule
    :func:`warn_on_mismatch` warns by."""
    if have is None or want is None:
        return False
    if label == "device":
        return not same_device(have, want, device_type)
    return str(have).strip().lower() != str(want).strip().lower()


def _number(x: Any) -> float | None:
    """A recorded sampling setting as a number; None where it is absent or no number (a file that does not say)."""
    try:
        return None if x is None or isinstance(x, bool) else float(x)
    except (TypeError, ValueError):
        return None


def sampling_differences(recorded_temperature: Any, recorded_top_p: Any, temperature: Any,
                         top_p: Any) -> list[tuple[str, float, float]]:
    """``(key, recorded, in use)`` for each sampling setting a profile (or the tree solved from it) recorded and the
    run differs in: ``temperature`` as numbers; ``top_p`` only where both sample (greedy decoding reads no nucleus;
    a greedy side is told by the temperature's own line). A side that does not say is not compared. The one rule
    :func:`warn_on_mismatch` and :func:`~sequoia_opt.jobs.entries.tree_mismatch_warnings` warn by."""
    out = []
    t_have, t_want = _number(recorded_temperature), _number(temperature)
    if t_have is not None and t_want is not None and t_have != t_want:
        out.append(("temperature", t_have, t_want))
    p_have, p_want = _number(recorded_top_p), _number(top_p)
    if (t_have or 0) > 0 and (t_want or 0) > 0 and p_have is not None and p_want is not None and p_have != p_want:
        out.append(("top_p", p_have, p_want))
    return out


def _sampling_mismatch(measured: Any, temperature: float | None, top_p: float | None, pid: str) -> list[str]:
    """A warning per sampling setting (:func:`sampling_differences`) an acceptance profile's ``measured`` records
    otherwise than the run."""
    return [f"profile {pid!r} was measured with {key} {have:g}, but this run uses {want:g}: its acceptance (and what "
            "is predicted or solved from it) is another setting's"
            for key, have, want in sampling_differences(measured.get("temperature"), measured.get("top_p"),
                                                        temperature, top_p)]


def same_weights(measured: Any, weights: Any, role: str) -> bool:
    """Whether a profile's ``measured.weights`` and ``weights`` (:func:`~sequoia_opt.jobs.load.weights_record`)
    both give model ``role`` a fingerprint and it is the same one: the same checkpoint, whatever its folder is
    called (a copy, a clone's)."""
    have = measured.get("weights") if isinstance(measured, dict) else None
    h = have.get(role) if isinstance(have, dict) else None
    w = weights.get(role) if isinstance(weights, dict) else None
    return (isinstance(h, dict) and isinstance(w, dict) and bool(h.get("fingerprint"))
            and str(h.get("fingerprint")) == str(w.get("fingerprint")))


def differing_weights(measured: Any, weights: Any) -> list[tuple[str, dict, dict]]:
    """``(role, recorded, in use)`` for each model (``target``, ``draft``) whose fingerprints a profile's
    ``measured.weights`` and ``weights`` (:func:`~sequoia_opt.jobs.load.weights_record`) both know and that differ;
    ``[]`` when a side records none. The one comparison :func:`weights_mismatch` words and
    :func:`~sequoia_opt.jobs.load.check_default_profile` refuses by."""
    have = measured.get("weights") if isinstance(measured, dict) else None
    if not isinstance(have, dict) or not isinstance(weights, dict):
        return []
    out = []
    for role in ("target", "draft"):
        h, w = have.get(role), weights.get(role)
        if isinstance(h, dict) and isinstance(w, dict) and h.get("fingerprint") and w.get("fingerprint") \
                and str(h["fingerprint"]) != str(w["fingerprint"]):
            out.append((role, h, w))
    return out


def weights_mismatch(measured: Any, weights: Any, names: Mapping[str, str] | None = None) -> list[str]:
    """Where a profile's recorded weights (``measured.weights``, :func:`~sequoia_opt.jobs.load.weights_record`)
    are not the weights in use (``weights``, the same layout): one phrase per model (``target``, ``draft``)
    whose fingerprints both sides know and that differ. A profile that records none (written before
    profiles recorded their weights), or a model either side does not name, is not compared. Profiles are filed by checkpoint name,
    so this is how ``run/a/checkpoint-1000``'s profile is told from ``run/b/checkpoint-1000``'s; a checkpoint
    moved or copied keeps its fingerprint and still matches. ``names``: a role's word in the phrase where it is not
    the role itself (a grafted tree's ``{"draft": "strong drafter"}``). Returns ``[]`` when nothing differs."""
    word = {**{"target": "target", "draft": "draft"}, **(names or {})}
    return [f"its {word[role]} weights{'' if h.get('path') == w.get('path') else ' at ' + str(h.get('path'))} "
            f"(fingerprint {h['fingerprint']}) are not the {word[role]} weights in use at {w.get('path')} "
            f"({w['fingerprint']})" for role, h, w in differing_weights(measured, weights)]


def warn_on_mismatch(
    *,
    acceptance: AcceptanceProfile | None = None,
    latency: LatencyCurve | None = None,
    device: str | None = None,
    dtype: str | None = None,
    target: str | None = None,
    draft: str | None = None,
    device_type: str | None = None,
    weights: dict | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
) -> list[str]:
    """Warnings (strings, one per problem) when the profiles were measured on another device / dtype / model
    pair than the one in use, or disagree with each other. Values that are unknown on either side are not
    compared. ``device`` is the device's name (``sequoia_opt.device.device_name``), ``device_type`` its torch
    type (``cpu``, ``cuda``), for profiles that recorded only a type (:func:`same_device`). Returns ``[]``
    when everything matches. ``weights``: the weights in use (:func:`~sequoia_opt.jobs.load.weights_record`),
    compared with an acceptance profile's by fingerprint (:func:`weights_mismatch`). ``temperature`` / ``top_p``:
    the run's sampling settings, compared with the acceptance profile's (the nucleus only where both sample; greedy
    decoding reads none): acceptance at another temperature is another vector.
    """
    out: list[str] = []

    def cmp(label: str, have: Any, want: Any, pid: str) -> None:
        if measured_differs(label, have, want, device_type):
            out.append(f"profile {pid!r} was measured with {label} {have!r}, but this run uses {want!r}")

    copy = {role: acceptance is not None and same_weights(acceptance.measured, weights, role)
            for role in ("target", "draft")}  # the same weights under another folder name: not another model
    if acceptance is not None:
        m = acceptance.measured
        if not copy["target"]:
            cmp("target", m.get("target"), target, acceptance.id)
        if not copy["draft"]:
            cmp("draft", m.get("draft"), draft, acceptance.id)
        cmp("device", m.get("device"), device, acceptance.id)
        cmp("dtype", m.get("dtype"), dtype, acceptance.id)
        out += [f"profile {acceptance.id!r} was measured with other weights: {w}"
                for w in weights_mismatch(m, weights)]
        out += _sampling_mismatch(m, temperature, top_p, acceptance.id)
        if acceptance.example:
            out.append(f"acceptance profile {acceptance.id!r} is EXAMPLE data, not a measurement")
    if latency is not None:
        cmp("device", latency.device.get("name"), device, latency.id)
        cmp("dtype", latency.device.get("dtype"), dtype, latency.id)
        for role, want in (("target", target), ("draft", draft)):  # the acceptance profile's copy, timed under its name
            named = latency.model.get(role)
            if not (copy[role] and named is not None and acceptance is not None
                    and not measured_differs(role, named, acceptance.measured.get(role))):
                cmp(role, named, want, latency.id)
        if latency.example:
            out.append(f"latency profile {latency.id!r} is EXAMPLE data, not a measurement")
    if acceptance is not None and latency is not None:
        for key, lk in (("target", "target"), ("draft", "draft")):
            a, b = acceptance.measured.get(key), latency.model.get(lk)
            if a is not None and b is not None and str(a).lower() != str(b).lower():
                out.append(f"the acceptance profile's {key} {a!r} differs from the latency profile's {b!r}")
        a_cost = acceptance.measured.get("draft_cost_model")
        if a_cost is not None and str(a_cost) != latency.cost_model:
            out.append(f"the acceptance profile's drafter has cost model {a_cost!r} but the latency profile charges "
                       f"{latency.cost_model!r}: the predicted cost is that of another kind of drafter")
    return out

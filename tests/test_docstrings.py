"""Every public function, class, method and property in ``sequoia_opt`` has a docstring of its own.

The project's rule is that the public API says, in its docstring, the tensor shapes, the units (ms, tokens), the
errors it raises and where an algorithm comes from; this audit checks the first step of that, that the docstring
exists at all, so that an undocumented ``to_dict`` or property is caught when it is added rather than in review.

What is audited:

* every module under ``sequoia_opt`` (``__main__`` modules are left out: importing one runs the CLI); a module
  whose top-level import needs an optional extra (``llama_cpp``, ``gguf``, ``sklearn``, ...) is skipped only when
  that extra is really missing, any other ImportError fails the test;
* in each module, the functions and classes *defined in that module* (``__module__`` is the module: re-exports
  are audited where they are defined) whose names do not start with ``_`` — private modules (``_io``,
  ``_entry``) included, since their public names are imported across the package;
* in each such class, the methods (plain, ``staticmethod``, ``classmethod``), properties and
  ``functools.cached_property`` attributes *defined on that class* (in its ``__dict__``) whose names do not start
  with ``_``; dunder methods and what ``dataclass`` / ``Enum`` / ``NamedTuple`` generate (``__init__``,
  ``_asdict``, field accessors, members) are therefore not audited, nor are annotated class attributes (a
  dataclass field whose default is a function, ``check: Callable[...] = lambda spec, config: None``, is data,
  described in the class's Attributes section).

What counts as a docstring:

* a class needs its own ``__doc__``: the signature line that ``dataclass`` writes into an undocumented class
  (``Name(x: int)``) and the field line of an undocumented ``NamedTuple`` (``Name(a, b)``) are not docstrings;
* a method or property needs its own docstring, or must override a method / property of the same name on a
  base class *inside sequoia_opt* that has one (the contract, with its shapes and units, is stated once on the
  protocol or base class and the override inherits it, as ``inspect.getdoc`` does). Inheriting from a base
  outside the package does not count: the generic doc of ``torch.nn.Module.forward`` or ``json.JSONEncoder.default``
  says nothing about this override's shapes or units.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import typing

import sequoia_opt

OPTIONAL = {"llama_cpp", "gguf", "sklearn", "triton", "vllm", "sglang", "tensorrt_llm", "matplotlib"}


def _modules() -> list:
    """The imported modules of the package (``__main__`` modules left out), in name order.

    Raises ImportError for a module that fails to import for any reason but a missing optional extra; a module
    whose missing extra is in ``OPTIONAL`` is left out."""
    out = [sequoia_opt]
    for info in sorted(pkgutil.walk_packages(sequoia_opt.__path__, "sequoia_opt."), key=lambda i: i.name):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            out.append(importlib.import_module(info.name))
        except ImportError as e:
            if (e.name or "").split(".")[0] not in OPTIONAL:
                raise
    return out


def _own_doc(obj) -> str:
    """The docstring ``obj`` itself carries ('' when none), unwrapping static/class methods and properties."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return (obj.__doc__ or (obj.fget.__doc__ if obj.fget else None) or "").strip()
    if isinstance(obj, functools.cached_property):
        return (obj.func.__doc__ or "").strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def _class_doc(cls: type) -> str:
    """The class's own docstring, '' when it has none or only the one ``dataclass`` / ``NamedTuple`` generate."""
    doc = (cls.__dict__.get("__doc__") or "").strip()
    generated = doc.startswith(cls.__name__ + "(") and doc.endswith(")") and "\n" not in doc
    return "" if generated else doc


def _is_member(value) -> bool:
    """Whether a class attribute is one the audit covers: a method, static/class method or (cached) property."""
    return isinstance(value, (staticmethod, classmethod, property, functools.cached_property)) \
        or inspect.isfunction(value) or (inspect.isroutine(value) and hasattr(value, "__wrapped__"))


def _inherits_doc(cls: type, name: str) -> bool:
    """Whether a base class of ``cls`` inside sequoia_opt documents the attribute ``name`` that ``cls`` overrides."""
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] == "sequoia_opt" and name in base.__dict__ \
                and _own_doc(base.__dict__[name]):
            return True
    return False


def _class_missing(cls: type) -> list[str]:
    """``Class`` and ``Class.attr`` for the class and each public method / property defined on it that has no
    docstring by the rules above (annotated attributes, dataclass fields, are data, not audited)."""
    missing = [] if _class_doc(cls) else [cls.__name__]
    fields = cls.__dict__.get("__annotations__", {})
    for attr, value in sorted(cls.__dict__.items()):
        if attr.startswith("_") or attr in fields or not _is_member(value):
            continue
        if not _own_doc(value) and not _inherits_doc(cls, attr):
            missing.append(f"{cls.__name__}.{attr}")
    return missing


def undocumented() -> list[str]:
    """Qualified names (``module:Class.attr``) of the public API with no docstring, by the rules above."""
    missing = []
    for mod in _modules():
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                missing += [f"{mod.__name__}:{q}" for q in _class_missing(obj)]
            elif inspect.isroutine(obj) and not _own_doc(obj):
                missing.append(f"{mod.__name__}:{name}")
    return missing


def test_the_audit_sees_the_package_and_its_kinds_of_member():
    """The walk reaches the subpackages and counts what the rules say: a sanity check on the audit itself."""
    names = {m.__name__ for m in _modules()}
    assert {"sequoia_opt.tree", "sequoia_opt.solver.schedule", "sequoia_opt.jobs.tune",
            "sequoia_opt.engines.llamacpp.binding", "sequoia_opt.model.gguf_loader"} <= names
    assert not any(n.endswith("__main__") for n in names)

    import dataclasses

    @dataclasses.dataclass
    class Plain:
        x: int

    class Pair(typing.NamedTuple):
        a: int

    assert _class_doc(Plain) == "" and _class_doc(Pair) == ""
    assert _own_doc(property(lambda self: 1, doc="one")) == "one"
    assert _own_doc(staticmethod(lambda: 1)) == ""

    import torch

    from sequoia_opt.drafting.policies.scheduler import GraftScheduler

    @dataclasses.dataclass
    class Module(torch.nn.Module):
        """A module whose ``forward`` overrides torch's generic, documented one without a word of its own."""

        hook: typing.Callable[[int], int] = lambda x: x  # a field, not a method

        def forward(self, x):
            return x

        @property
        def width(self) -> int:
            return 1

        @functools.cached_property
        def table(self) -> list:
            return []

        @staticmethod
        def make() -> "Module":
            """A fresh one."""
            return Module()

    class Scheduler(GraftScheduler):
        """Overrides a method the package's base class documents."""

        def decide(self, features) -> bool:
            return True

    assert _class_missing(Module) == ["Module.forward", "Module.table", "Module.width"]
    assert _class_missing(Scheduler) == [] and _class_missing(Plain) == ["Plain"]


def test_every_public_function_class_method_and_property_has_a_docstring():
    missing = undocumented()
    assert not missing, f"{len(missing)} public names have no docstring:\n" + "\n".join(missing)

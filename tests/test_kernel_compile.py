"""Compile the CUDA tree-attention kernel with nvcc (no GPU needed): catches syntax, template and PTX errors,
and register spills, on machines without a device. Skipped where nvcc is absent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from sequoia_opt.attention import cuda as ta_cuda


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


NVCC = _nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (no CUDA toolkit on this machine)")


@needs_nvcc
def test_kernel_compiles_for_sm80_and_sm90_without_spills(tmp_path):
    kdir = ta_cuda.kernel_dir()
    try:  # the defines torch's JIT build adds (no implicit half/bf16 conversions), so that build sees no surprise
        from torch.utils.cpp_extension import COMMON_NVCC_FLAGS as torch_flags
    except ImportError:  # pragma: no cover
        torch_flags = []
    cmd = [
        NVCC, "-std=c++17", "-O3", "--use_fast_math", "-c", *torch_flags,
        "-gencode", "arch=compute_80,code=sm_80",
        "-gencode", "arch=compute_90,code=sm_90",
        "-Xptxas", "-v",
        "-o", str(tmp_path / "tree_attention.o"), str(kdir / "tree_attention.cu"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = proc.stderr
    # 2 archs x (split + combine) x {fp16, bf16} x {64, 128}
    for arch in ("sm_80", "sm_90"):
        entries = re.findall(rf"Compiling entry function '(\w+)' for '{arch}'", report)
        assert sum("split_kernel" in e for e in entries) == 4, entries
        assert sum("combine_kernel" in e for e in entries) == 4, entries
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(frames) == 16
    assert all(f == ("0", "0", "0") for f in frames), f"local memory use or spills: {frames}"
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert max(regs) <= 255


@needs_nvcc
def test_kernel_ptx_uses_tensor_cores_and_async_copies(tmp_path):
    kdir = ta_cuda.kernel_dir()
    ptx = tmp_path / "tree_attention.ptx"
    proc = subprocess.run(
        [NVCC, "-std=c++17", "-O3", "--use_fast_math", "-ptx", "-arch=sm_90", "-o", str(ptx), str(kdir / "tree_attention.cu")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = ptx.read_text()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in text
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in text
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in text
    assert "cp.async.cg.shared.global" in text
    assert "ld.local" not in text and "st.local" not in text


@pytest.mark.slow
@needs_nvcc
def test_binding_syntax_against_torch_headers(tmp_path):
    """The torch binding (tree_attention_binding.cpp) parses against this torch's headers. A CPU build of
    torch lacks one generated CUDA header (c10/cuda/impl/cuda_cmake_macros.h); a stub stands in for it.
    Slow: about a minute, torch/extension.h is heavy."""
    torch_ext = pytest.importorskip("torch.utils.cpp_extension")
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    homes = [os.environ.get("CUDA_HOME"), torch_ext.CUDA_HOME, "/usr/local/cuda", str(Path(NVCC).resolve().parents[1])]
    incs = [Path(h) / "include" for h in homes if h]
    cuda_inc = next((i for i in incs if (i / "cuda_runtime.h").is_file()), None)
    if cuda_inc is None:
        pytest.skip(f"cuda_runtime.h not found in {incs}")
    cmd = [cxx, "-std=c++20", "-fsyntax-only", f"-I{tmp_path / 'stub'}", f"-I{sysconfig.get_paths()['include']}",
           f"-I{cuda_inc}", f"-I{ta_cuda.kernel_dir()}", "-DTORCH_EXTENSION_NAME=treeopt_tree_attention_check",
           "-DTORCH_API_INCLUDE_EXTENSION_H"]  # fmt: skip
    cmd += [f"-I{p}" for p in torch_ext.include_paths()]
    cmd.append(str(ta_cuda.kernel_dir() / "tree_attention_binding.cpp"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_kernel_sources_ship_as_package_data():
    # sequoia_opt/kernels links to the repository's kernels/, so a wheel (package data "kernels/*") carries the
    # same sources that a source checkout builds from
    pkg = Path(ta_cuda.__file__).resolve().parents[1] / "kernels"
    repo = Path(ta_cuda.__file__).resolve().parents[2] / "kernels"
    for name in ta_cuda._SOURCES:
        assert (pkg / name).read_bytes() == (repo / name).read_bytes()

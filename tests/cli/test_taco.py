"""``ucf taco``: TACO's command line, read as TACO spells it, compiled by ucf."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import ucf
from tests.helpers import needs_cc
from ucf.cli import main
from ucf.codegen.c import functions
from ucf.format.taco_letters import from_taco

SPMV = "y(i) = A(i,j) * x(j)"


@pytest.mark.parametrize(
    "letters, ordering, ucf_format",
    [
        ("d", "", "U"),
        ("ds", "", "UC"),
        ("ds", "1,0", "UC:1,0"),
        ("ss", "", "CC"),
        ("uq", "", "CS"),
        ("ucq", "", "CSS"),
        ("sss", "", "CCC"),
        ("dz", "", "UC"),
    ],
)
def test_taco_letters_are_read_as_taco_means_them(letters, ordering, ucf_format):
    assert from_taco(letters, ordering) == ucf_format
    # and they store what TACO's format would: CSR, CSC, DCSR, COO, CSF
    rng = np.random.default_rng(len(letters))
    a = (rng.random((4,) * len(letters)) < 0.4) * rng.random((4,) * len(letters))
    np.testing.assert_array_equal(ucf.from_numpy(a, ucf_format).to_numpy(), a)


@pytest.mark.parametrize(
    "letters, words",
    [
        ("dp", "no singleton, padded level"),
        ("du", "except above a singleton"),
        ("dx", "'x' is not one of TACO's mode formats"),
    ],
)
def test_what_ucf_cannot_store_is_refused_by_name(letters, words):
    with pytest.raises(ucf.FormatError, match=words):
        from_taco(letters)


def compute_of(expr, formats, schedule=None, dtype=None):
    """The compute function ucf.compile gives for ucf's own spelling, as ucf taco names it."""
    from dataclasses import replace

    k = ucf.compile(expr, formats, schedule=schedule, target="c", dtype=dtype)
    return functions([replace(k._user_plan.compute, name="compute")])


def test_the_default_output_is_the_compute_function(capsys):
    assert main(["taco", SPMV, "-f=A:ds", "-print-nocolor"]) == 0
    printed = capsys.readouterr().out
    assert printed == compute_of(SPMV, {"A": "UC"})
    assert "void compute(" in printed and "A1_pos[pA0]" in printed


def test_options_map_onto_ucf_compile(capsys):
    argv = ["taco", SPMV, "-f=A:ds:1,0", "-t=A:float", "-t=y:float", "-s=split(j,j0,j1,4),"
            "unroll(j1,4)", "-d=i:5"]  # fmt: skip
    assert main(argv) == 0
    want = compute_of(
        SPMV, {"A": "UC:1,0@float32"}, "split(j,j0,j1,4); unroll(j1,4)", dtype="float32"
    )
    assert capsys.readouterr().out == want
    assert main([*argv[:-1], "--print-concrete"]) == 0  # TACO reads -- as -
    cin = capsys.readouterr().out
    assert cin.startswith("forall(j0, forall(j1, forall(i,")


def test_assembly_and_evaluate_print_the_sparse_outputs_passes(capsys):
    add = "A(i,j) = B(i,j) + C(i,j)"
    assert main(["taco", add, "-f=A:ds", "-f=B:ds", "-f=C:ds", "-print-evaluate"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("void assemble(") < printed.index("void compute(")
    assert main(["taco", SPMV, "-print-assembly"]) == 0
    assert "a dense output needs no assemble function" in capsys.readouterr().out


@pytest.mark.parametrize(
    "option, words",
    [
        ("-time", "use ucf run ... --time N"),
        ("-i=A:a.mtx", "use ucf run ... -i T:FILE"),
        ("-print-iteration-graph", "ucf compile ... --print cin"),
        ("-nthreads=4", "UCF_NUM_THREADS"),
        ("-frobnicate", "unknown option '-frobnicate'"),
        ("-t=A:complexfloat", "not 'complexfloat'"),
        ("-f=A", "expected -f=<tensor>:<format>"),
    ],
)
def test_options_ucf_taco_does_not_honour_say_what_to_use(option, words, capsys):
    assert main(["taco", SPMV, option]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ucf taco: error:") and words in err


def test_help_version_and_a_bare_command_print_usage(capsys):
    for argv in (["taco"], ["taco", "-help"]):
        assert main(argv) == 0
        assert capsys.readouterr().out.startswith("usage: ucf taco <index expression>")
    assert main(["taco", "-help=scheduling"]) == 0
    assert "Separate\nthem with commas" in capsys.readouterr().out
    assert main(["taco", "-version"]) == 0
    assert "TACO's command line" in capsys.readouterr().out


def test_ucf_compile_points_taco_letters_at_ucf_taco(capsys):
    assert main(["compile", SPMV, "-f=A:ds"]) == 1
    err = capsys.readouterr().err
    assert "'ds' reads as TACO's letters, which are ucf's 'UC'" in err and "ucf taco" in err


@needs_cc
def test_write_source_writes_tacos_abi_that_compiles(tmp_path, capsys):
    prefix = tmp_path / "spmv.c"
    assert main(["taco", SPMV, "-f=A:ds", f"-write-source={prefix}"]) == 0
    assert "void compute(" not in capsys.readouterr().out  # writing replaces printing
    source = prefix.read_text()
    assert "int compute(taco_tensor_t*" in (tmp_path / "spmv.h").read_text()
    assert "compute(" in source
    subprocess.run(
        ["cc", "-c", "-Wall", "-Werror", str(prefix), "-o", str(tmp_path / "spmv.o")],
        check=True,
        cwd=tmp_path,
    )

"""What the last block is: the paper's block alone, the authors' code (the map
``hidden_states[L-1] -> hidden_states[L]`` of ``output_hidden_states=True``, final norm included)
or left out. The authors' convention is checked against an oracle built from the model's own
forward pass, on every architecture (and variant) of the table."""

from __future__ import annotations

import pytest
import torch

from coupling_utils.engine.architectures import (
    ARCHITECTURES,
    Architecture,
    final_norm,
    find_architecture,
    hidden_states_norm,
    supported_architectures,
    tiny_model,
    transformer_blocks,
)
from coupling_utils.engine.blocks import (
    LAST_BLOCKS,
    block_function,
    check_last_block,
    last_block_facts,
    last_block_norm,
)
from coupling_utils.engine.jacobians import context_jacobians, reference_jacobians, token_jacobians
from coupling_utils.engine.spectra import matrix_free_topk

CASES = [(a.model_types[0], None) for a in ARCHITECTURES] + [
    (a.model_types[0], v) for a in ARCHITECTURES for v in a.tiny_variants
]
IDS = [f"{t}-{v}" if v else t for t, v in CASES]


def _inputs(model, T=7):
    row = find_architecture(model)
    if row.modality == "vision":
        c = row.tiny
        return {"pixel_values": torch.randn(1, c["num_channels"], c["image_size"], c["image_size"])}
    return {"input_ids": torch.randint(0, 64, (1, T))}


def _last_hidden(model, inputs):
    """``(g, X0)``: ``g(X) = hidden_states[L]`` of the model's own forward pass (``output_hidden_states``)
    with ``X`` put in place of the last block's input, and ``X0 = hidden_states[L-1]``."""
    blocks = transformer_blocks(model)
    L = len(blocks)
    with torch.no_grad():
        hs = model(**inputs, output_hidden_states=True).hidden_states
    assert len(hs) == L + 1
    X0 = hs[L - 1][0].detach()

    def g(X):
        def replace(module, args, kwargs):
            if args:
                return (X.unsqueeze(0), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": X.unsqueeze(0)}

        handle = blocks[L - 1].register_forward_pre_hook(replace, with_kwargs=True)
        try:
            return model(**inputs, output_hidden_states=True).hidden_states[L][0]
        finally:
            handle.remove()

    return g, X0


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("model_type,variant", CASES, ids=IDS)
def test_final_norm_convention_is_the_jacobian_of_the_last_hidden_state(model_type, variant):
    torch.manual_seed(0)
    model = tiny_model(model_type, variant=variant)
    inputs = _inputs(model)
    g, X0 = _last_hidden(model, inputs)
    torch.testing.assert_close(g(X0), model(**inputs, output_hidden_states=True).hidden_states[-1][0])
    F = torch.autograd.functional.jacobian(g, X0, vectorize=True)  # [T, d, T, d]: [t2, :, t1, :]
    T, d = X0.shape
    eye = torch.eye(d)
    own = torch.stack([F[t, :, t, :] for t in range(T)]) - eye  # the residual Jacobians J_tt
    last = len(transformer_blocks(model)) - 1
    J = token_jacobians(model, inputs, last, last_block="final_norm")
    R = reference_jacobians(model, inputs, last, last_block="final_norm", tokens=[0, T - 1])
    assert rel(J, own) <= 1e-5, "token-diagonal sweep vs hidden_states[L] of the model's forward"
    assert rel(R, own[[0, T - 1]]) <= 1e-5
    t2 = T - 1
    C = context_jacobians(model, inputs, last, t2, last_block="final_norm")  # [t1, d, d]
    oracle = F[t2].permute(1, 0, 2).clone()  # [t1, d_out, d_in]
    oracle[t2] -= eye  # the identity only where the skip connection is
    assert rel(C, oracle) <= 1e-5, "context Jacobians (t1 != t2) under the authors' convention"
    if find_architecture(model).causal == "causal":
        assert C[:t2].abs().max() > 0  # the context Jacobians were compared, not just zeros


@pytest.mark.parametrize("model_type,variant", CASES, ids=IDS)
def test_the_block_alone_differs_exactly_where_a_norm_is_folded_in(model_type, variant):
    model = tiny_model(model_type, variant=variant)
    inputs = _inputs(model)
    last = len(transformer_blocks(model)) - 1
    J_block = token_jacobians(model, inputs, last)
    J_norm = token_jacobians(model, inputs, last, last_block="final_norm")
    norm = hidden_states_norm(model)
    if norm is None:  # no norm in hidden_states[L]: the two conventions are one map
        row = find_architecture(model)
        assert row.final_norm is None or not row.norm_in_hidden_states
        torch.testing.assert_close(J_norm, J_block, rtol=0, atol=0)
        return
    assert rel(J_norm, J_block) > 1e-2, "the final norm changes the last block's Jacobian"
    # the authors' J equals N'(J + I) - I, N' the final norm's Jacobian at the block's output
    f, X = block_function(model, inputs, last, token_diagonal=False)
    Y = (X + f(X)).detach()
    for t in (0, X.shape[0] - 1):
        N = torch.autograd.functional.jacobian(lambda y: norm(y[None])[0], Y[t])  # [d, d]
        eye = torch.eye(N.shape[0])
        torch.testing.assert_close(J_norm[t], N @ (J_block[t] + eye) - eye, rtol=1e-4, atol=1e-5)
    # every other block is the same under every convention
    for convention in LAST_BLOCKS:
        torch.testing.assert_close(
            token_jacobians(model, inputs, 0, last_block=convention), token_jacobians(model, inputs, 0)
        )


def test_matrix_free_products_use_the_same_last_block():
    model = tiny_model("llama")
    inputs = _inputs(model, T=6)
    J = token_jacobians(model, inputs, 1, last_block="final_norm")
    top = matrix_free_topk(model, inputs, 1, 4, last_block="final_norm")
    exact = torch.linalg.svdvals(J)[:, :4]
    torch.testing.assert_close(top.svd.S, exact, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(matrix_free_topk(model, inputs, 1, 4).svd.S, exact, rtol=1e-3)


def test_excluded_refuses_the_last_block_only():
    model = tiny_model("gpt2")
    inputs = _inputs(model)
    token_jacobians(model, inputs, 0, last_block="excluded")  # not the last block: measured
    for layer in (1, -1):
        with pytest.raises(
            ValueError, match=r"block 1 is the last block, and last_block='excluded'.*blocks 0\.\.0,"
        ):
            token_jacobians(model, inputs, layer, last_block="excluded")
    with pytest.raises(ValueError, match=r"last_block must be one of \('block', 'final_norm', 'excluded'\)"):
        block_function(model, inputs, 0, last_block="norm")
    says = r"the paper's definition; 'final_norm': with the final norm, as the authors' code measured it; "
    with pytest.raises(ValueError, match=says + "'excluded'"):  # what each choice means
        check_last_block("norm")
    # the default is the paper's: the last block alone, no norm folded in
    assert last_block_norm(model, 1) is None and last_block_norm(model, -1, "final_norm") is not None
    for layer in (2, -3):
        with pytest.raises(IndexError, match=r"layer -?\d out of range: the model has 2 blocks \(0\.\.1\)"):
            last_block_norm(model, layer)
    with pytest.raises(ValueError, match="got 'x'"):
        check_last_block("x")


@pytest.mark.parametrize("row", ARCHITECTURES, ids=[a.model_types[0] for a in ARCHITECTURES])
def test_last_block_facts_name_the_folded_norm_where_the_table_says_it_lives(row):
    """A measurement's provenance says, per convention, which block is last, whether it is measured
    and which norm is folded into it: its class and the table's path(s), or None for none."""
    model = tiny_model(row.model_types[0])
    last = len(transformer_blocks(model)) - 1
    norm = hidden_states_norm(model)
    path = supported_architectures().set_index("name").loc[row.name, "final_norm"]
    alone = {"convention": "block", "block": last, "measured": True, "folded_norm": None, "norm_path": None}
    assert last_block_facts(model) == last_block_facts(model, "block") == alone
    assert last_block_facts(model, "excluded") == {**alone, "convention": "excluded", "measured": False}
    folded = last_block_facts(model, "final_norm")
    assert folded == {
        **alone,
        "convention": "final_norm",
        "folded_norm": None if norm is None else type(norm).__name__,
        "norm_path": None if norm is None else path,
    }


@pytest.mark.parametrize("row", ARCHITECTURES, ids=[a.model_types[0] for a in ARCHITECTURES])
def test_every_row_knows_its_final_norm(row):
    model = tiny_model(row.model_types[0])
    norm = final_norm(model)
    if row.final_norm is None:
        assert norm is None
        return
    assert isinstance(norm, torch.nn.Module) and "norm" in type(norm).__name__.lower()
    assert hidden_states_norm(model) is (norm if row.norm_in_hidden_states else None)
    table = supported_architectures().set_index("name")
    assert table.loc[row.name, "final_norm"].startswith("base_model.")


def test_a_row_must_say_where_its_final_norm_is():
    with pytest.raises(ValueError, match="say where its final norm lives"):
        Architecture("X", ("x",), (), ("layers",), "XLayer")
    assert supported_architectures().set_index("name").loc["BERT", "final_norm"] == "none"


def test_opt_post_norm_has_no_final_norm():
    model = tiny_model("opt")
    model.model.decoder.final_layer_norm = None  # as in opt-350m (do_layer_norm_before=False)
    assert final_norm(model) is None and hidden_states_norm(model) is None


# --------------------------------------------------------------------------- the measurement setting
def test_the_setting_is_checked_and_keys_only_when_not_the_default():
    from coupling_utils.measurement.jobs import Job
    from coupling_utils.measurement.settings import Settings, upgrade

    with pytest.raises(ValueError, match=r"last_block must be one of .*got 'norm'"):
        Settings(last_block="norm")
    assert "last_block" not in Settings().to_dict(runtime=False)
    assert Settings(last_block="final_norm").to_dict(runtime=False)["last_block"] == "final_norm"
    parts = {"depth": Settings(k=(10, 30), tokens="all"), "tokens": Settings(layers=[3], context="last")}
    job = Job("org/model", {"a": "one two"}, parts, {"dtype": "float32"}, root="/r")
    # the keys the same job had before the setting existed: the default book's stores stay valid
    assert job.out("depth").name == "depth-213a514775e4" and job.out("tokens").name == "tokens-a8afe6cf6fe5"
    assert job.key == "eb2df3055ffd"
    folded = {"depth": Settings(k=(10, 30), tokens="all", last_block="final_norm")}
    other = Job("org/model", {"a": "one two"}, folded, {"dtype": "float32"}, root="/r")
    assert other.out("depth") != job.out("depth")
    assert upgrade({"method": "exact"})["last_block"] == "block"  # settings.json from before it


def test_measure_uses_the_setting_and_says_so(tmp_path):
    from coupling_utils.measurement import measure

    model = tiny_model("llama")  # 2 blocks
    ids = {"a": torch.randint(0, 64, (1, 5))}
    plain = measure(model, ids, k=(2, 4), out=tmp_path / "block")
    folded = measure(model, ids, k=(2, 4), last_block="final_norm", out=tmp_path / "final_norm")
    s_last = token_jacobians(model, ids["a"], 1, last_block="final_norm")[-1]
    sv = folded.singular_values
    got = sv[(sv.layer == 1)].sort_values("rank").value.to_numpy()[:4]
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float32), torch.linalg.svdvals(s_last)[:4])
    first = plain.singular_values
    pd_first = first[first.layer == 0].value.to_numpy()
    assert (sv[sv.layer == 0].value.to_numpy() == pd_first).all()  # block 0 is the same map
    assert plain.provenance["settings"]["last_block"] == "block"
    assert folded.provenance["last_block"] == {
        "convention": "final_norm", "block": 1, "measured": True, "folded_norm": "LlamaRMSNorm",
        "norm_path": "base_model.norm",
    }  # fmt: skip
    assert plain.provenance["last_block"]["folded_norm"] is None
    with pytest.raises(ValueError, match="holds a measurement with other settings \\(last_block\\)"):
        measure(model, ids, k=(2, 4), out=tmp_path / "block", last_block="final_norm")


def test_excluded_measures_every_block_but_the_last(tmp_path):
    from coupling_utils.measurement import measure

    model = tiny_model("llama")
    ids = {"a": torch.randint(0, 64, (1, 4))}
    with pytest.raises(ValueError, match="leaves 1 block\\(s\\) of 2: too few to couple"):
        measure(model, ids, k=2, last_block="excluded")
    import transformers

    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=3, n_head=2, n_positions=16)
    model3 = transformers.GPT2LMHeadModel(config).eval()
    m = measure(model3, ids, k=2, last_block="excluded", out=tmp_path / "ex")
    assert sorted(set(m.depthwise.layer_i)) == [0, 1]
    assert m.provenance["last_block"]["measured"] is False
    with pytest.raises(ValueError, match="layers includes the last block 2, which last_block='excluded'"):
        measure(model3, ids, k=2, layers=[0, -1], last_block="excluded")


def test_the_measure_command_takes_last_block():
    from coupling_utils.pipeline.cli import build_parser
    from coupling_utils.pipeline.measure_models import MeasureError, measurement_settings

    assert measurement_settings(last_block="final_norm").last_block == "final_norm"
    with pytest.raises(MeasureError, match="last_block must be one of"):
        measurement_settings(last_block="nope")
    args = build_parser().parse_args(["measure", "org/model", "--last-block", "final_norm", "--out", "x"])
    assert args.last_block == "final_norm"


def test_a_verdict_changed_under_two_conventions_is_said_once():
    from coupling_utils.analysis.last_block import changed_verdicts

    names = {"depth": "depth-wise", "tiles": "tiles"}
    both = changed_verdicts(
        {"depth": "yes", "tiles": "no"},
        {"block": {"depth": "partly", "tiles": "no"}, "excluded": {"depth": "partly", "tiles": "yes"}},
        names,
    )
    assert both == (
        "The depth-wise row, *yes* here, would be *partly* under 'block' and under 'excluded'; "
        "the tiles row, *no* here, would be *yes* under 'excluded': "
        "the status table says so in each row's note."
    )
    others = {"block": {"depth": "partly"}, "excluded": {"depth": "no"}}
    apart = changed_verdicts({"depth": "yes"}, others, names)
    assert apart.count("depth-wise row") == 2 and "*yes* here, would be *partly* under 'block';" in apart
    alike = changed_verdicts(
        {"depth": "yes", "tiles": "yes"}, {"block": {"depth": "no", "tiles": "no"}}, names
    )
    assert alike.startswith("The depth-wise and tiles rows, *yes* here, would be *no* under 'block':")
    same = changed_verdicts({"depth": "yes"}, {"block": {"depth": "yes"}}, names)
    assert same == "No verdict judged under 'block' changes."
    one_still = changed_verdicts(
        {"depth": "yes"}, {"block": {"depth": "no"}, "excluded": {"depth": "yes"}}, names
    )
    assert one_still.endswith("row's note. No verdict judged under 'excluded' changes.")


def test_rows_not_judged_under_a_convention_are_named():
    """A sentence that says no verdict changes says under which convention, and names the rows
    that were not judged there (None or missing), rather than counting them as unchanged."""
    from coupling_utils.analysis.last_block import changed_verdicts, convention_note

    names = {"family": "family", "within": "training-family", "hub": "hub-models"}
    own = {"family": "no", "within": "partly", "hub": None}  # hub: no such row in this run
    said = changed_verdicts(own, {"block": {"family": "no", "within": None}, "excluded": {}}, names)
    assert said == (
        "No verdict judged under 'block' changes. "
        "Not judged: the training-family row under 'block'; every row under 'excluded'."
    )
    assert "hub" not in said
    assert changed_verdicts(own, {"block": {}}, names) == "Not judged: every row under 'block'."
    assert changed_verdicts(own, {}, names) == "No other convention was judged."
    note = convention_note("final_norm", "partly", {"block": None, "excluded": None})
    assert note == "last block: 'final_norm'; not judged under 'block' or 'excluded'"
    note = convention_note("final_norm", "no", {"block": "no", "excluded": None})
    assert note == "last block: 'final_norm'; not judged under 'excluded'; the same under 'block'"

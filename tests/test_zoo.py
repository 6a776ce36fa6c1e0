"""The model zoo: every model trains one step, builds reproducibly, and has the published size."""

import pytest
import torch

from edge_remat_agent.zoo import MODELS, ZooError, build

pytestmark = pytest.mark.slow

# Small but real variants: the architecture is unchanged, only the data and vocab shrink.
SMALL = {
    "mlp": dict(image=32),
    "resnet18": dict(image=32),
    "resnet18-imagenet": dict(image=64),
    "resnet50": dict(image=32),
    "resnet50-imagenet": dict(image=64),
    "mobilenet_v2": dict(image=64),
    "vgg11": dict(image=32),
    "vgg16": dict(image=32),
    "bert-tiny": dict(seq=16, vocab=512),
    "bert-mini": dict(seq=16, vocab=512),
    "bert-base": dict(seq=16, vocab=512),
    "gpt2-small": dict(seq=16, vocab=512),
    "gpt2-small-lora": dict(seq=16, vocab=512),
    "gpt-tiny": dict(seq=16),
    "gpt-mini": dict(seq=16, vocab=512),
    "gpt-tiny-lora": dict(seq=16),
    "digits-cnn": dict(image=16, depth=2),
    "conv-gru": dict(seq=16),
    "lstm-lm": dict(seq=8, vocab=64),
    "tinyllama-1.1b-lora": dict(seq=8, layers=1, vocab=512),
    "tinyllama-2l-lora": dict(seq=8, layers=1, vocab=512),
    "llama-tiny-lora": dict(seq=8),
}


def _n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_every_model_has_a_small_variant():
    assert set(SMALL) == set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_backward(name):
    model, args = build(name, batch=2, **SMALL[name])
    loss = model(*args)
    assert loss.dim() == 0 and loss.requires_grad and torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        if not p.requires_grad:  # a LoRA model's frozen base
            assert p.grad is None and "lora" in name
            continue
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {pname} has a non-finite gradient"


@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenet_v2", "bert-tiny", "gpt2-small"])
def test_build_is_deterministic(name):
    def loss(seed):
        model, args = build(name, batch=2, seed=seed, **SMALL[name])
        torch.manual_seed(123)  # the same dropout masks in every run
        return model(*args).detach()

    assert torch.equal(loss(0), loss(0))
    assert not torch.equal(loss(0), loss(1))


def test_build_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    build("mlp", batch=2)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_name():
    with pytest.raises(ZooError) as info:
        build("resnet1000")
    assert isinstance(info.value, ValueError)
    for name in MODELS:
        assert name in str(info.value)


def test_bad_configuration_is_a_zoo_error():
    with pytest.raises(ZooError, match="multiple of 32"):
        build("vgg11", image=40)
    with pytest.raises(ZooError, match="max_positions"):
        build("bert-tiny", seq=1024)


# Published parameter counts (torchvision / the BERT and GPT-2 papers' checkpoints).
@pytest.mark.parametrize(
    "name, keywords, expected",
    [
        ("resnet18", {}, 11.17e6),
        ("resnet50-imagenet", dict(num_classes=1000), 25.56e6),
        ("mobilenet_v2", dict(num_classes=1000), 3.50e6),
        ("vgg16", dict(num_classes=1000, image=224, batch=1), 138.36e6),
        ("bert-base", dict(batch=1), 109.48e6),
        ("gpt2-small", dict(n_ctx=1024, batch=1), 124.44e6),
    ],
)
def test_parameter_counts(name, keywords, expected):
    model, _ = build(name, **keywords)  # count only: no forward on the big ones
    assert _n_params(model) == pytest.approx(expected, rel=0.01)


def test_vgg_batch_norm_is_optional():
    plain, _ = build("vgg11", batch=1)
    with_bn, _ = build("vgg11", batch=1, batch_norm=True)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in plain.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in with_bn.modules()) == 8

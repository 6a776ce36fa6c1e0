"""Models as users write them, for the bring-your-own-model tests (MODULE:FACTORY specs)."""

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = str(Path(__file__).resolve())


class TiedLM(nn.Module):
    """A small language model whose output head shares the embedding's weight."""

    def __init__(self, vocab=100, width=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        logits = self.head(torch.tanh(self.mix(self.emb(ids[:, :-1]))))
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def make_tied_lm(batch: int = 4, seq: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return TiedLM(), (torch.randint(0, 100, (batch, seq)),)


class SharedBiasHead(nn.Module):
    """As BERT's masked-LM head: a bias of its own that its decoder also holds (the decoder
    reads it; the head's own name, the first, reads nothing)."""

    def __init__(self, vocab=50, width=16):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.emb = nn.Embedding(vocab, width)
        self.decoder = nn.Linear(width, vocab)
        self.decoder.bias = self.bias

    def forward(self, ids):
        logits = self.decoder(torch.tanh(self.emb(ids[:, :-1])))
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def make_shared_bias_head(batch: int = 4, seq: int = 12, seed: int = 0):
    torch.manual_seed(seed)
    return SharedBiasHead(), (torch.randint(0, 50, (batch, seq)),)


def make_eval_mode_model(batch: int = 4, seed: int = 0):
    """A factory that returns its model in eval mode: dropout off, batch norm reading its
    running statistics (and keeping them)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.ReLU(),
                          nn.Linear(16, 1))

    class Regression(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, y):
            return F.mse_loss(self.net(x), y)
    return Regression().eval(), (torch.randn(batch, 8), torch.randn(batch, 1))


class LateSwitch(nn.Module):
    """A variational model whose KL term a step counter in a module attribute switches on
    after 6 steps (a KL warm-up): Python state the forward changes and reads."""

    def __init__(self):
        super().__init__()
        self.enc, self.dec, self.step = nn.Linear(16, 16), nn.Linear(8, 16), 0

    def forward(self, x):
        self.step += 1
        mu, log_var = self.enc(x).chunk(2, -1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
        beta = 1.0 if self.step > 6 else 0.0
        kl = -0.5 * torch.mean(1 + log_var - mu ** 2 - log_var.exp())
        return F.mse_loss(self.dec(z), x) + beta * kl


def make_late_switch(batch: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return LateSwitch(), (torch.randn(batch, 16),)


class SmallUNet(nn.Module):
    """A U-Net: concatenated skips, a transposed convolution and bilinear, bicubic and nearest
    upsampling, a pixel-wise binary cross-entropy."""

    def __init__(self, width=8):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(inplace=True))
        self.mid = nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.fuse = nn.Conv2d(3 * width, width, 3, padding=1)
        self.out = nn.Conv2d(width, 1, 1)

    def forward(self, images, masks):
        skip = self.down(images)
        deep = self.mid(F.max_pool2d(skip, 2))
        smooth = F.interpolate(deep, scale_factor=2, mode="bilinear", align_corners=False)
        sharp = F.interpolate(deep, scale_factor=2, mode="bicubic", align_corners=True)
        near = F.interpolate(deep, scale_factor=2, mode="nearest")
        x = torch.cat([self.up(deep) + smooth[:, ::2] + sharp[:, 1::2], near[:, :8], skip], 1)
        return F.binary_cross_entropy_with_logits(self.out(F.relu(self.fuse(x))), masks)


def make_unet(batch: int = 4, image: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    images = torch.randn(batch, 3, image, image)
    return SmallUNet(), (images, (images.mean(1, keepdim=True) > 0).float())


class DictBatch(nn.Module):
    """A forward that takes its batch as a dict and a list, as data loaders hand them."""

    def __init__(self):
        super().__init__()
        self.image = nn.Linear(12, 16)
        self.meta = nn.Linear(4, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, batch, extras):
        h = F.gelu(self.image(batch["image"]) + self.meta(extras[0]) * extras[1]["scale"])
        return F.cross_entropy(self.head(h), batch["label"])


def make_dict_batch(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return DictBatch(), ({"label": torch.randint(0, 3, (batch,)), "image": torch.randn(batch, 12)},
                         [torch.randn(batch, 4), {"scale": torch.rand(batch, 1)}])


class Encoder(nn.Module):
    """nn.TransformerEncoder, batch first, with dropout: it drops out attention's transposed
    (non-contiguous) output."""

    def __init__(self, width=32):
        super().__init__()
        self.embed = nn.Linear(10, width)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 1)

    def forward(self, x, y):
        return F.mse_loss(self.head(self.encoder(self.embed(x)).mean(1)).squeeze(-1), y)


def make_encoder(batch: int = 8, seq: int = 10, seed: int = 0):
    torch.manual_seed(seed)
    return Encoder(), (torch.randn(batch, seq, 10), torch.randn(batch))


class Noisy(nn.Module):
    """An MLP with randomness beyond nn.Dropout in its middle: RReLU in training mode, or a
    straight-through (hard) Gumbel-softmax."""

    def __init__(self, middle: str):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)
        self.middle = middle

    def forward(self, x, y):
        h = torch.tanh(self.a(x))
        if self.middle == "rrelu":
            h = F.rrelu(h, training=True)
        else:
            h = F.gumbel_softmax(h, tau=0.5, hard=True) * h
        return F.cross_entropy(self.c(torch.tanh(self.b(h))), y)


def make_rrelu(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return Noisy("rrelu"), (torch.randn(batch, 16), torch.randint(0, 4, (batch,)))


def make_hard_gumbel(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return Noisy("gumbel"), (torch.randn(batch, 16), torch.randint(0, 4, (batch,)))


class Parametrized(nn.Module):
    """Layers behind parametrizations: weight_norm, spectral_norm (its power iteration updates
    buffers in forward) and a user's own (a symmetrised weight)."""

    def __init__(self):
        from torch.nn.utils import parametrize
        from torch.nn.utils.parametrizations import spectral_norm, weight_norm
        super().__init__()
        self.a = weight_norm(nn.Linear(16, 32))
        self.b = spectral_norm(nn.Linear(32, 32))
        self.c = nn.Linear(32, 4)
        parametrize.register_parametrization(self.c, "weight", _Symmetrised())

    def forward(self, x, y):
        return F.cross_entropy(self.c(torch.relu(self.b(torch.relu(self.a(x))))), y)


class _Symmetrised(nn.Module):
    def forward(self, w):
        return w * 0.5 + 0.5 * w.flip(0)


def make_parametrized(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return Parametrized(), (torch.randn(batch, 16), torch.randint(0, 4, (batch,)))


class GruClassifier(nn.Module):
    """nn.GRU over a sequence, classified from its last step."""

    def __init__(self, hidden: int):
        super().__init__()
        self.gru = nn.GRU(16, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.gru(x)[0][:, -1]), y)


def make_gru(hidden: int = 32, batch: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    return GruClassifier(hidden), (torch.randn(batch, 3, 16), torch.randint(0, 4, (batch,)))


class Gaussian(nn.Module):
    """A Gaussian negative log-likelihood with a learned covariance: linalg.cholesky, solve and
    inv, which check LAPACK's status as eager does (an effectful op in the joint graph).
    `singular` zeroes every matrix's last row, where eager's solve raises (the pivot is an
    exact zero whatever the rounding: a rank-one matrix of repeated columns was not, on some
    CPUs' LAPACK, and solved to garbage)."""

    def __init__(self, dim: int = 4, singular: bool = False):
        super().__init__()
        self.factor = nn.Linear(dim, dim * dim)
        self.dim, self.singular = dim, singular

    def forward(self, x):
        m = self.factor(x).view(-1, self.dim, self.dim)
        if self.singular:
            m = torch.cat([m[:, :-1], torch.zeros_like(m[:, :1])], dim=1)
            return torch.linalg.solve(m, x.unsqueeze(-1)).sum()
        cov = m @ m.transpose(1, 2) + torch.eye(self.dim)
        chol = torch.linalg.cholesky(cov)
        white = torch.linalg.solve(cov, x.unsqueeze(-1)).squeeze(-1)
        return ((x * white).sum(-1) + 2 * chol.diagonal(dim1=1, dim2=2).log().sum(-1)).mean() \
            + torch.linalg.inv(cov).diagonal(dim1=1, dim2=2).mean()


def make_gaussian(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return Gaussian(), (torch.randn(batch, 4),)


def make_singular_solve(batch: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    return Gaussian(singular=True), (torch.randn(batch, 4),)


class Products(nn.Module):
    """torch.prod in a block, trained through (`trained=True`), or only under no_grad beside
    the cumulative product the refusal suggests."""

    def __init__(self, trained: bool):
        super().__init__()
        self.block = nn.Linear(8, 5)
        self.trained = trained

    def forward(self, x):
        h = self.block(x) + 2
        if self.trained:
            return h.prod(1).mean()
        with torch.no_grad():
            scale = h.prod(1, keepdim=True)
        return torch.cumprod(h, 1).select(1, -1).mean() + (h / scale).mean()


class _Wrapped(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self.inner(*args)


def make_trained_prod(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return _Wrapped(Products(trained=True)), (torch.randn(batch, 8),)


def make_untrained_prod(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return Products(trained=False), (torch.randn(batch, 8),)


class FunctionalCall(nn.Module):
    """A layer called through torch.func.functional_call with a learned offset on its weight:
    the offset's gradient is `t(t(mm))`, a view of a view of the layer's weight gradient."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.delta = nn.Parameter(torch.zeros(8, 8))

    def forward(self, x):
        params = {"weight": self.inner.weight + self.delta, "bias": self.inner.bias}
        return (torch.func.functional_call(self.inner, params, (x,)) ** 2).mean()


def make_functional_call(batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return FunctionalCall(), (torch.randn(batch, 8),)


class BagOfWords(nn.Module):
    """A text classifier over nn.EmbeddingBag in mean or max mode."""

    def __init__(self, mode: str):
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 16, mode=mode)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens, labels):
        return F.cross_entropy(self.head(self.bag(tokens)), labels)


def make_bag_of_words(mode: str = "mean", batch: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    return BagOfWords(mode), (torch.randint(0, 50, (batch, 6)), torch.randint(0, 4, (batch,)))


def make_bag_of_words_max(batch: int = 8, seed: int = 0):
    return make_bag_of_words("max", batch, seed)


def spec(factory: str) -> str:
    return f"{HERE}:{factory}"


class AliasedGradients(nn.Module):
    """a's gradient and b's are one storage: b is read through a view of a's shape."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(4, 4)), nn.Parameter(torch.randn(16))

    def forward(self, x):
        return ((self.a + self.b.view(4, 4)) * x).pow(2).sum()


def make_aliased_gradients(seed: int = 0):
    torch.manual_seed(seed)
    return AliasedGradients(), (torch.randn(4, 4) * 3,)

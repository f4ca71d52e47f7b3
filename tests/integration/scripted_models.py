"""TorchScript modules for the tests, saved with Debian's python3-torch: python3 scripted_models.py NAME PATH."""
import sys

import torch


class MlpDropout(torch.nn.Module):
    """fc1 -> relu -> dropout -> fc2: children called in order."""

    def __init__(self, d_in: int = 32, hidden: int = 48, d_out: int = 10):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.drop = torch.nn.Dropout(0.2)
        self.fc2 = torch.nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class Regressor(torch.nn.Module):
    """A regression head: 32 features -> 4 targets."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class MlpBatchNorm(torch.nn.Module):
    """fc1 -> batch norm -> relu -> fc2: running statistics are state that a forward pass changes."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 24)
        self.bn = torch.nn.BatchNorm1d(24)
        self.fc2 = torch.nn.Linear(24, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


class EmbedClassifier(torch.nn.Module):
    """Token ids [T] -> embedding -> layer norm -> mean over T -> linear: an Embedding submodule,
    which weight decay on matrices only skips."""

    def __init__(self, vocab: int = 40, d: int = 24, d_out: int = 10):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d_out)

    def forward(self, x):
        return self.fc(self.norm(self.emb(x)).mean(1))


class Erfcx(torch.nn.Module):
    """A classifier ending in torch.special.erfcx, which has no bfloat16 CPU kernel: it trains in
    fp32 and cannot run under bf16 autocast."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        return torch.special.erfcx(self.fc(x))


class Zeta(torch.nn.Module):
    """A classifier ending in torch.special.zeta, which has no derivative: it cannot be trained."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        h = self.fc(x)
        return torch.special.zeta(h.abs() + 2.0, h.abs() + 1.0)


class TokenLM(torch.nn.Module):
    """A tiny language model over tokens data: ids [B, T] -> embedding -> tanh -> linear -> logits
    [B, T, V] (V = 512, scripts/tokenize.py's vocabulary)."""

    def __init__(self, vocab: int = 512, d: int = 16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(torch.tanh(self.emb(x)))


MODELS = {"erfcx": Erfcx, "zeta": Zeta, "mlp_dropout": MlpDropout, "regressor": Regressor, "mlp_bn": MlpBatchNorm, "embed": EmbedClassifier,
          "token_lm": TokenLM}

if __name__ == "__main__":
    torch.manual_seed(7)
    torch.jit.script(MODELS[sys.argv[1]]()).save(sys.argv[2])

"""Mars's graph encoder (torch, PyTorch Geometric): a GCN over the unit graph, pre-trained by Deep Graph Infomax.

"Accelerated Device Placement Optimization with Contrastive Learning" (Lan, Chen, Li, ICPP 2021)
encodes every op with a graph convolutional network whose weights are first learned without any
labels or step times: Deep Graph Infomax (Velickovic et al., ICLR 2019) trains the encoder so a
bilinear discriminator can tell each node's embedding of the real graph, scored against a summary
of the whole graph, from the embedding of a corrupted graph whose feature rows are shuffled among
the nodes. An encoder that wins that game must encode each node's place in its neighbourhood, which
is what a placer needs to know about it.

Here a node is a placement unit (``unit_graph``: the units Mars places, their ``features`` vectors
and the edges between them, made symmetric), so pre-training sees the same graphs the placer does.
``pretrain`` runs DGI over many graphs (``devplace train mars-encoder``); the encoder it writes is a
small file of tensors and plain metadata (``save_encoder``/``load_encoder``), and one made by a
committed command ships as ``devplace/data/mars-encoder.pt``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import DeepGraphInfomax, GCNConv

from devplace.errors import DevplaceError
from devplace.fileio import write_bytes_atomic
from devplace.learn.features import N_FEATURES, cross_unit_edges, unit_features

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "mars-encoder.pt"
FORMAT = "devplace-mars-encoder-1"


@dataclass
class UnitGraph:
    """What the encoder reads of one graph: (units, N_FEATURES) features and a symmetric edge index."""

    x: torch.Tensor            # (U, N_FEATURES) float32
    edge_index: torch.Tensor   # (2, E) long, both directions, no duplicates, no self loops

    @property
    def n_units(self) -> int:
        return self.x.shape[0]


def unit_graph(graph, unit_of: np.ndarray) -> UnitGraph:
    """The graph of units ``unit_of`` (numbered in step order) as the encoder reads it."""
    src, dst = cross_unit_edges(graph, np.asarray(unit_of, dtype=np.int64))
    n = int(np.max(unit_of)) + 1 if len(unit_of) else 0
    pairs = np.unique(np.concatenate([src * n + dst, dst * n + src]))
    edge_index = torch.from_numpy(np.stack([pairs // n, pairs % n]).astype(np.int64))
    return UnitGraph(torch.from_numpy(unit_features(graph, unit_of)), edge_index)


class GCNEncoder(nn.Module):
    """Two GCN layers with PReLU (the encoder of DGI's transductive experiments, one layer deeper so a
    unit sees its neighbours' neighbours): (U, N_FEATURES) -> (U, hidden)."""

    def __init__(self, hidden: int, n_features: int = N_FEATURES):
        super().__init__()
        self.hidden = hidden
        self.conv1, self.act1 = GCNConv(n_features, hidden), nn.PReLU(hidden)
        self.conv2, self.act2 = GCNConv(hidden, hidden), nn.PReLU(hidden)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.act2(self.conv2(self.act1(self.conv1(x, edge_index)), edge_index))


def _summary(z: torch.Tensor, *args) -> torch.Tensor:
    """DGI's readout: the sigmoid of the mean node embedding."""
    return torch.sigmoid(z.mean(dim=0))


class _Shuffle:
    """DGI's corruption: the feature rows permuted among the nodes, the edges kept; seeded."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def __call__(self, x: torch.Tensor, edge_index: torch.Tensor):
        return x[torch.randperm(x.shape[0], generator=self.generator)], edge_index


def dgi_model(hidden: int, generator: torch.Generator) -> DeepGraphInfomax:
    """PyTorch Geometric's DeepGraphInfomax around a fresh ``GCNEncoder`` (build it inside ``train.seeded``)."""
    return DeepGraphInfomax(hidden, GCNEncoder(hidden), _summary, _Shuffle(generator))


def dgi_loss(model: DeepGraphInfomax, g: UnitGraph) -> torch.Tensor:
    return model.loss(*model(g.x, g.edge_index))


@torch.no_grad()
def discriminator_accuracy(model: DeepGraphInfomax, graphs: list[UnitGraph]) -> float:
    """Fraction of real and corrupted node embeddings the discriminator tells apart (0.5: chance), over all nodes."""
    right = total = 0
    for g in graphs:
        pos, neg, summary = model(g.x, g.edge_index)
        right += int((model.discriminate(pos, summary, sigmoid=False) > 0).sum())
        right += int((model.discriminate(neg, summary, sigmoid=False) <= 0).sum())
        total += 2 * g.n_units
    return right / max(total, 1)


def pretrain(graphs: list[UnitGraph], *, hidden: int, epochs: int, seed: int, learning_rate: float = 0.001,
             report=None) -> DeepGraphInfomax:
    """DGI on ``graphs``: each epoch one Adam step per graph, in a seeded order (Adam at 0.001 as
    PyTorch Geometric's DGI example). ``report(epoch, mean_loss)`` is called after each epoch."""
    from devplace.learn.train import one_thread, seeded

    if not graphs:
        raise DevplaceError("mars-encoder: no graphs to pre-train on: give at least one graph")
    generator = torch.Generator().manual_seed(seed)
    with seeded(seed):
        model = dgi_model(hidden, generator)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    with one_thread():
        for epoch in range(epochs):
            losses = []
            for i in torch.randperm(len(graphs), generator=generator).tolist():
                optimizer.zero_grad()
                loss = dgi_loss(model, graphs[i])
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
            if report is not None:
                report(epoch + 1, float(np.mean(losses)))
    return model


def save_encoder(path: "str | Path", model: DeepGraphInfomax, meta: dict) -> None:
    """Write the encoder's (and discriminator's) tensors and ``meta`` (plain values), atomically."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "hidden": model.hidden_channels, "n_features": N_FEATURES,
                "state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "meta": meta}, buffer)
    write_bytes_atomic(path, buffer.getvalue())


def load_encoder(path: "str | Path") -> tuple[DeepGraphInfomax, dict]:
    """The DGI model saved at ``path`` and its metadata; a clear error for a missing or foreign file."""
    try:
        saved = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise DevplaceError(f"mars encoder {str(path)!r} does not exist: make one with `devplace train "
                            f"mars-encoder -o FILE` or leave option encoder empty for the shipped one") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise DevplaceError(f"cannot read mars encoder {str(path)!r} ({type(exc).__name__}): make it with "
                            f"`devplace train mars-encoder -o FILE`") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or saved.get("n_features") != N_FEATURES:
        raise DevplaceError(f"{str(path)!r} is not a mars encoder of this devplace (features {N_FEATURES}): "
                            f"make one with `devplace train mars-encoder -o FILE`")
    model = dgi_model(int(saved["hidden"]), torch.Generator())
    model.load_state_dict(saved["state"])
    return model, saved["meta"]


# The graphs the shipped encoder is pre-trained on: the bundled graphs, every zoo model at its test
# size and at a second size, and the training split of every graph family (``devplace families``;
# captured with roofline costs; features never read op times). The families' held-out members stay unseen.
DEFAULT_CORPUS = (
    *(f"data:{name}" for name in ("gnmt_layers_training.json", "bert_l-3_training.json",
                                  "bert_l-3_inference.json", "resnet50_inference.json")),
    *(f"zoo:{name}:preset=small" for name in ("gnmt", "inception_v3", "mlp", "nasnet", "resnet50", "rnnlm",
                                             "small_cnn", "transformer")),
    "zoo:gnmt:preset=small,layers=2", "zoo:rnnlm:preset=small,layers=4", "zoo:transformer:preset=small,layers=4",
    *(f"family:{name}" for name in ("nasnet", "recurrent", "transformer")),
)


def corpus_graphs(source: str, cluster) -> list[tuple[str, object]]:
    """The pre-training graphs ``source`` names, as (name, graph): ``data:FILE`` (bundled), ``family:NAME``
    (the training split of a graph family, ``devplace families``), a graph file, or a model target
    captured for ``cluster``."""
    from devplace.io import load_graph

    if source.startswith("data:"):
        from devplace import example_path

        return [(source, load_graph(example_path(source[5:])))]
    if source.startswith("family:"):
        from devplace.zoo import families

        train, _ = families.split(source[7:])
        return [(f"{source}:{m.model}:" + ",".join(f"{k}={v}" for k, v in m.config), families.load(m)) for m in train]
    if source.startswith("zoo:") or ".py:" in source:
        from devplace.torchcapture import profile_target

        return [(source, profile_target(source, cost="roofline", cluster=cluster))]
    return [(source, load_graph(source))]


def train_encoder(output: "str | Path", sources, *, cluster, seed: int, epochs: int, hidden: int, max_units: int,
                  report=None) -> dict:
    """Pre-train an encoder on the unit graphs of ``sources`` and save it to ``output``; returns its metadata."""
    from devplace.learn.mars import mars_units

    graphs, sizes = [], {}
    for source in sources:
        for name, graph in corpus_graphs(source, cluster):
            graphs.append(unit_graph(graph, mars_units(graph, max_units).unit_of))
            sizes[name] = graphs[-1].n_units
            if report is not None:
                report(f"{name}: {graph.n_ops} ops, {sizes[name]} units")
    model = pretrain(graphs, hidden=hidden, epochs=epochs, seed=seed,
                     report=None if report is None else lambda e, loss: report(f"epoch {e}: DGI loss {loss:.4f}"))
    meta = {"seed": seed, "epochs": epochs, "hidden": hidden, "max_units": max_units, "graphs": sizes,
            "train_accuracy": discriminator_accuracy(model, graphs)}
    save_encoder(output, model, meta)
    return meta

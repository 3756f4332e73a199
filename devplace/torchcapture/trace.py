"""Tracing one training step (forward, backward, optimizer update) into an ATen-level fx graph.

``trace_step`` runs ``make_fx`` in fake mode over a function that calls the model through
``torch.func.functional_call``, takes ``torch.autograd.grad`` of the loss and steps a
``torch.optim`` optimizer as PyTorch runs it (``UPDATES``: multi-tensor, fused or per parameter).
No real activation is allocated. The placeholders are, in order: parameters, buffers, optimizer
state, inputs; ``TracedStep`` says which is which, so the
same ``gm`` can be run again on real tensors (``real_args``) by the measured cost model or an executor.

Every node carries ``meta["custom"]["phase"]`` (forward/backward/update) and, for update ops, the
parameter it updates; forward nodes carry the stack of modules running when they were created
(``meta["nn_module_stack"]``, see ``scope_of``). Backward -> forward links come from autograd sequence numbers: hooks
on every autograd Node stamp each backward node with the sequence number of the Node it runs, and a
forward node carries the ``seq_nr`` of the Node it created (see ``mirror_of``).
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass, field

import torch
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from devplace.errors import CaptureError

OPTIMIZERS = ("adam", "adamw", "sgd", "none")
# How the optimizer step runs: multi-tensor kernels over every parameter (PyTorch's default on GPUs),
# one fused kernel, or a loop over parameters (``foreach=False``; what eager CPU steps compared with
# capture use). The multi-tensor and fused ops are split into one op per parameter (``split_updates``).
UPDATES = ("foreach", "fused", "per-parameter")


@dataclass
class TracedStep:
    """An fx graph of one training step and what its placeholders stand for."""

    gm: torch.fx.GraphModule
    param_names: list[str]
    buffer_names: list[str]
    # placeholder node name -> ("param"|"buffer"|"state"|"input", owning parameter/buffer name or "")
    placeholder_info: dict[str, tuple[str, str]]
    optimizer: str
    # fx node name of each parameter's gradient (the values autograd.grad returned)
    grad_nodes: dict[str, str] = field(default_factory=dict)
    update: str = "per-parameter"

    def real_args(self, model: torch.nn.Module, example_inputs, targets=()) -> list:
        """Concrete placeholder values: copies of the weights, zero optimizer state, inputs, targets."""
        params = [p.detach().clone() for _, p in model.named_parameters()]
        buffers = [b.detach().clone() for _, b in model.named_buffers()]
        return [*params, *buffers, *_initial_state(params, self.optimizer),
                *_flat_inputs(example_inputs)[0], *_flat_targets(targets)]


def _initial_state(params: list[torch.Tensor], optimizer: str) -> list[torch.Tensor]:
    """Adam/AdamW keep (step, exp_avg, exp_avg_sq) per parameter; plain SGD keeps nothing."""
    if optimizer in ("adam", "adamw"):
        out = []
        for p in params:
            out += [torch.zeros((), dtype=torch.float32), torch.zeros_like(p), torch.zeros_like(p)]
        return out
    return []


STATE_NAMES = {"adam": ("step", "exp_avg", "exp_avg_sq"), "adamw": ("step", "exp_avg", "exp_avg_sq")}


# Non-tensor values a model may be called with; they are constants of the traced step.
CONSTANTS = (type(None), bool, int, float)
INPUT_FORMS = ("a tensor, a tuple of positional inputs or a dict of keyword inputs "
               "(tensors, or None/int/float/bool constants), e.g. {'input_ids': ids, 'attention_mask': None}")


def _flat_inputs(example_inputs) -> tuple[list, callable]:
    """(the tensors, rebuild(tensors) -> (args, kwargs)) for the inputs a model is called with:
    a tensor, a tuple/list of positional inputs or a dict of keyword inputs. Tensors become graph
    inputs; constants (None, ints, bools, ...) stay fixed in the traced step."""
    if isinstance(example_inputs, torch.Tensor):
        return [example_inputs], lambda xs: ((xs[0],), {})
    if isinstance(example_inputs, (tuple, list)):
        positional, keyword = list(example_inputs), {}
    elif isinstance(example_inputs, dict):
        positional, keyword = [], dict(example_inputs)
    else:
        raise CaptureError(f"example_inputs is a {type(example_inputs).__name__}: give {INPUT_FORMS}")
    for where, value in [*((f"[{i}]", v) for i, v in enumerate(positional)), *((f"[{k!r}]", v) for k, v in keyword.items())]:
        if not isinstance(value, (torch.Tensor, *CONSTANTS)):
            raise CaptureError(f"example_inputs{where} is a {type(value).__name__}: give {INPUT_FORMS}")
    tensors = [v for v in [*positional, *keyword.values()] if isinstance(v, torch.Tensor)]

    def rebuild(xs):
        supply = iter(xs)
        fill = lambda v: next(supply) if isinstance(v, torch.Tensor) else v  # noqa: E731
        return tuple(fill(v) for v in positional), {k: fill(v) for k, v in keyword.items()}

    return tensors, rebuild


def _flat_targets(targets) -> list:
    items = [targets] if isinstance(targets, torch.Tensor) else list(targets or ())
    for i, x in enumerate(items):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(
                f"targets[{i}] is a {type(x).__name__}: targets must be tensors "
                f"(bind other arguments into the loss function)"
            )
    return items


def _make_optimizer(name: str, params: list[torch.Tensor], update: str = "per-parameter"):
    form = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(update, {"foreach": False})
    if name == "adam":
        return torch.optim.Adam(params, **form)
    if name == "adamw":
        return torch.optim.AdamW(params, **form)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2, **form)
    raise CaptureError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


class _ModuleStack:
    """Hooks that track which submodule is running, so every fx node records the module path it came
    from (``meta["nn_module_stack"]``, read by ``scope_of``) and a tracing failure can name the module.

    Setting ``fx_traceback.current_meta`` from hooks is what works here: make_fx copies it onto each
    node it creates under ``preserve_node_meta()``, while make_fx's ``record_module_stack`` recorded
    nothing for a model run through ``functional_call``. The caller must ``remove()`` in a finally.
    """

    def __init__(self, model: torch.nn.Module):
        self.stack: list[tuple[str, str]] = []  # (module path, class name), innermost last
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(name, type(module).__name__)))
            self.handles.append(module.register_forward_hook(self._leave))

    @property
    def innermost(self) -> str:
        path, cls = self.stack[-1]
        return f"{path or '<root>'} ({cls})"

    def _enter(self, path: str, cls: str):
        def hook(module, args):
            self.stack.append((path, cls))
            self._publish()
        return hook

    def _leave(self, module, args, output):
        # not called when forward raises, so the innermost failing module stays on top
        self.stack.pop()
        self._publish()

    def _publish(self) -> None:
        fx_traceback.current_meta["nn_module_stack"] = {f"{i}:{path}": (path, cls) for i, (path, cls) in enumerate(self.stack)}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def scope_of(node: torch.fx.Node) -> str:
    """Path of the innermost module whose forward created ``node`` ("" for the root or no module)."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def trace_step(model: torch.nn.Module, example_inputs, loss_fn, optimizer: str = "adam", targets=(),
               update: str = "foreach") -> TracedStep:
    """Trace forward + backward + optimizer update of ``model`` on ``example_inputs`` (fake mode).

    The loss is ``loss_fn(model_output, *targets)``; targets become graph inputs like the batch.
    ``update`` is how the optimizer step runs (``UPDATES``).
    """
    if update not in UPDATES:
        raise CaptureError(f"unknown optimizer update {update!r}: use one of {', '.join(UPDATES)}")
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    if optimizer is None:
        optimizer = "none"
    if optimizer not in OPTIMIZERS:
        raise CaptureError(f"unknown optimizer {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if not callable(loss_fn):
        raise CaptureError(f"loss_fn must be callable (output -> scalar tensor), not {type(loss_fn).__name__}")
    param_names = [n for n, _ in model.named_parameters()]
    if not param_names:
        raise CaptureError(f"the model {type(model).__name__} has no parameters: there is no training step to capture")
    buffer_names = [n for n, _ in model.named_buffers()]
    inputs, rebuild = _flat_inputs(example_inputs)
    target_list = _flat_targets(targets)
    n_in = len(inputs)
    n_p, n_b = len(param_names), len(buffer_names)
    n_state = len(STATE_NAMES.get(optimizer, ()))
    modules = _ModuleStack(model)
    failure: dict = {}

    def step(*flat):
        params = list(flat[:n_p])
        buffers = list(flat[n_p : n_p + n_b])
        state = list(flat[n_p + n_b : n_p + n_b + n_p * n_state])
        rest = list(flat[n_p + n_b + n_p * n_state :])
        args, kwargs = rebuild(rest[:n_in])
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            with fx_traceback.annotate({"phase": "forward"}):
                try:
                    out = torch.func.functional_call(
                        model, {**dict(zip(param_names, params)), **dict(zip(buffer_names, buffers))},
                        args, kwargs,
                    )
                except CaptureError:
                    raise
                except Exception:
                    failure["module"] = modules.innermost if modules.stack else f"<root> ({type(model).__name__})"
                    raise
                loss = loss_fn(out, *rest[n_in:])
            _check_loss(loss)
        _stamp_backward_nodes(loss)
        with fx_traceback.annotate({"phase": "backward"}):
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        if optimizer != "none":
            with torch.no_grad():
                _step(optimizer, update, param_names, params, grads, state, n_state)
        return loss.detach(), [g for g in grads]

    fake_args = [*[p.detach() for _, p in model.named_parameters()],
                 *[b.detach() for _, b in model.named_buffers()],
                 *_initial_state([p.detach() for _, p in model.named_parameters()], optimizer),
                 *inputs, *target_list]
    was_training = model.training
    model.train()
    try:
        with fx_traceback.preserve_node_meta(), warnings_quiet():
            gm = make_fx(step, tracing_mode="fake", _allow_non_fake_inputs=True)(*fake_args)
    except CaptureError:
        raise
    except Exception as exc:
        reason = _first_line(exc)
        if "module" in failure:
            raise CaptureError(f"the forward pass cannot be traced: module {failure['module']} failed: {reason}") from exc
        raise CaptureError(f"the training step cannot be traced: {reason}") from exc
    finally:
        modules.remove()
        model.train(was_training)
    traced = _label(gm, param_names, buffer_names, optimizer, n_state, n_in, len(target_list))
    traced.update = update
    if update != "per-parameter":
        split_updates(traced)
    return traced


def _step(optimizer: str, update: str, param_names, params, grads, state, n_state: int) -> None:
    """Trace the optimizer step: per parameter (each op annotated with its parameter), or one
    multi-tensor/fused step over all parameters with gradients (split per parameter afterwards)."""
    stepped = [(i, name, p) for i, (name, p, g) in enumerate(zip(param_names, params, grads)) if g is not None]
    for i, _, p in stepped:
        p.grad = grads[i]

    def optimizer_for(group):
        opt = _make_optimizer(optimizer, [p for _, _, p in group], update)
        for i, _, p in group if n_state else ():
            opt.state[p] = dict(zip(STATE_NAMES[optimizer], state[i * n_state : (i + 1) * n_state]))
        return opt

    if update == "per-parameter":
        for entry in stepped:
            with fx_traceback.annotate({"phase": "update", "param": entry[1]}):
                optimizer_for([entry]).step()
    elif stepped:
        with fx_traceback.annotate({"phase": "update"}):
            optimizer_for(stepped).step()
    for _, _, p in stepped:
        p.grad = None


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor):
        raise CaptureError(f"loss_fn must return a scalar tensor, not {type(loss).__name__}")
    if loss.dim() != 0:
        raise CaptureError(
            f"loss_fn must return a scalar (0-d) tensor, but it returned one of shape {tuple(loss.shape)}: "
            f"reduce it, e.g. with .mean() or .sum()"
        )
    if not loss.requires_grad:
        raise CaptureError("the loss does not depend on any parameter: loss_fn must use the model's output")


def _stamp_backward_nodes(loss: torch.Tensor) -> None:
    """Tag every backward fx node traced while autograd runs a Node with that Node's sequence number.

    Hooks on every Node reachable from the loss put ``meta["custom"]["grad_fn"]`` in place for the
    length of the Node's run (pre-hook in, post-hook out). A backward node traced outside every
    Node's run carries none: the root gradient ``autograd.grad`` seeds, and the sums the engine
    makes when several Nodes send a gradient to one tensor (``mirror_of`` says why that matters).
    """
    saved: list = []  # the custom annotation outside the Node now running, innermost last

    def enter(seq: int):
        def prehook(grad_outputs):
            custom = fx_traceback.current_meta.get("custom") or {}
            saved.append(custom)
            fx_traceback.current_meta["custom"] = {**custom, "grad_fn": seq}
        return prehook

    def leave(grad_inputs, grad_outputs):
        fx_traceback.current_meta["custom"] = saved.pop()

    seen, todo = set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        fn.register_prehook(enter(fn._sequence_nr()))
        fn.register_hook(leave)
        todo.extend(next_fn for next_fn, _ in fn.next_functions)


@contextlib.contextmanager
def warnings_quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _label(gm, param_names, buffer_names, optimizer, n_state, n_inputs, n_targets) -> TracedStep:
    """Rename placeholders after what they hold (param_fc1_weight, ...) and record their meaning."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    labels: list[tuple[str, str, str]] = []  # (new name stem, kind, owner)
    for name in param_names:
        labels.append((f"param_{name}", "param", name))
    for name in buffer_names:
        labels.append((f"buffer_{name}", "buffer", name))
    for name in param_names:
        for s in STATE_NAMES.get(optimizer, ())[:n_state]:
            labels.append((f"state_{name}_{s}", "state", name))
    for i in range(n_inputs):
        labels.append((f"input_{i}", "input", ""))
    for i in range(n_targets):
        labels.append((f"target_{i}", "target", ""))
    info: dict[str, tuple[str, str]] = {}
    for node, (stem, kind, owner) in zip(placeholders, labels):
        node.name = gm.graph._graph_namespace.create_name(stem.replace(".", "_"), None)
        node.target = node.name
        info[node.name] = (kind, owner)
    gm.recompile()
    out = next(n for n in gm.graph.nodes if n.op == "output")
    grads = out.args[0][1]
    grad_nodes = {name: g.name for name, g in zip(param_names, grads) if isinstance(g, torch.fx.Node)}
    return TracedStep(gm, param_names, buffer_names, info, optimizer, grad_nodes)


def split_updates(traced: TracedStep) -> None:
    """Replace each multi-tensor (``_foreach_*``) and fused (``_fused_*``) update op by one call per
    parameter on one-element lists, annotated with its parameter and its share of the kernel launch.

    A multi-tensor kernel updates every parameter of one device at once; which parameters share a
    device is what placement decides, so the graph holds the per-parameter pieces (each placeable with
    its parameter) and the cost models charge each piece its elements' share of one launch.
    """
    gm = traced.gm
    owner = {name: owner for name, (kind, owner) in traced.placeholder_info.items() if kind in ("param", "state")}
    owner |= {grad: param for param, grad in traced.grad_nodes.items()}
    for node in list(gm.graph.nodes):
        name = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
        if _phase(node) != "update" or not name.startswith(("_foreach_", "_fused_")):
            continue
        lists = [a for a in node.args if isinstance(a, (list, tuple)) and a]
        n = len(lists[0]) if lists else 0
        if n < 2 or any(u.target is not operator.getitem for u in node.users):
            continue
        sizes = [_numel(lists[0][j]) for j in range(n)]
        total = sum(sizes) or 1
        pieces = []
        for j in range(n):
            pick = lambda a: [a[j]] if isinstance(a, (list, tuple)) and len(a) == n else a  # noqa: E731
            with gm.graph.inserting_before(node):
                piece = gm.graph.call_function(node.target, tuple(pick(a) for a in node.args),
                                               {k: pick(v) for k, v in node.kwargs.items()})
            piece.meta = {**node.meta, "custom": {**node.meta["custom"], "launches": sizes[j] / total}}
            value = node.meta.get("val")
            piece.meta["val"] = [value[j]] if isinstance(value, (list, tuple)) else value
            param = next((owner[x.name] for a in lists for x in [a[j]] if isinstance(x, torch.fx.Node) and x.name in owner), None)
            if param is not None:
                piece.meta["custom"]["param"] = param
                owner[piece.name] = param
            pieces.append(piece)
        for user in list(node.users):
            piece = pieces[user.args[1]]
            user.args = (piece, 0)
            if piece.name in owner:
                owner[user.name] = owner[piece.name]
        gm.graph.erase_node(node)
    for node in gm.graph.nodes:  # e.g. reading a step count: the parameter its inputs all belong to
        custom = node.meta.get("custom") or {}
        if node.op == "call_function" and custom.get("phase") == "update" and "param" not in custom:
            params = {owner[x.name] for x in node.all_input_nodes if x.name in owner}
            if len(params) == 1:
                node.meta["custom"] = {**custom, "param": params.pop()}
                owner[node.name] = node.meta["custom"]["param"]
    gm.recompile()


def _numel(x) -> int:
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    return value.numel() if isinstance(value, torch.Tensor) else 1


def mirror_of(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Backward fx node name -> the forward fx node whose gradient it computes.

    A forward node's ``seq_nr`` is that of the last autograd Node created so far, so the first
    forward node with a given ``seq_nr`` is the one that created the Node; later ones that created
    none repeat it. A backward node traced while autograd ran a Node carries that Node's sequence
    number (``meta["custom"]["grad_fn"]``, see ``_stamp_backward_nodes``) and mirrors its creator.

    The others ran outside every Node: the root gradient (``ones_like`` of the loss) and, above
    all, gradient accumulation: when a tensor is used several times (an LSTM weight at every time
    step, an embedding output, a residual), the engine sums the gradients arriving in the tensor's
    input buffer with ``add`` ops between two Nodes' runs. torch's own ``seq_nr`` for those is the
    forward rule's, the last Node created, i.e. the loss's, which glued thousands of unrelated sums
    to the loss (one co-placement group of nearly all of GNMT). They belong to the tensor whose
    gradients they sum, whose grad_fn is the Node that reads the sum next (or, past a Node that
    only passes gradients on, the one after it): each such op takes the mirror of the first of its
    readers (in graph order) that has one, following chains of sums. So the root gradient mirrors
    the loss, and a parameter's sum, read by no Node (autograd.grad returns it), mirrors nothing
    (-1 in the graph) and stays in the parameter's colocation group.
    """
    creator: dict[int, str] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and _phase(node) == "forward":
            seq = node.meta.get("seq_nr")
            if seq is not None and seq >= 0:
                creator.setdefault(seq, node.name)
    links: dict[str, str] = {}
    for node in reversed(gm.graph.nodes):  # readers before what they read
        if node.op != "call_function" or _phase(node) != "backward":
            continue
        seq = node.meta["custom"].get("grad_fn")
        if seq is not None:
            target = creator.get(seq)
        else:
            target = next((links[user.name] for user in node.users if user.name in links), None)
        if target is not None:
            links[node.name] = target
    return links


def _phase(node: torch.fx.Node) -> str:
    return (node.meta.get("custom") or {}).get("phase", "other")

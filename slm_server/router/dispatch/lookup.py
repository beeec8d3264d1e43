"""Lookup of enabled models by id and alias, checked to serve the API shape asked. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from slm_server.errors import AmbiguousModel, InvalidRequest, ModelNotFound, UnsupportedEndpoint
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.shape import Shape

# Ollama's default tag.
LATEST = ":latest"


class Registry:
    """The enabled models, by id and by alias. Disabled entries are known but never
    routed to.

    ``models`` and ``enabled`` hold one spec per replica (an entry with ``replicas: 3``
    is three backends, an entry with ``replica_of`` one more of the entry it names);
    :meth:`lookup` and :meth:`route` answer with an entry's first replica and
    :meth:`replicas` with all of them, in order.
    """

    def __init__(self, models: Sequence[ModelSpec]) -> None:
        self.replace(models)

    def replace(self, models: Sequence[ModelSpec]) -> None:
        """Route by ``models`` from now on. The tables are built first and then bound
        in one step, with nothing awaited: every part of the router that holds this
        registry reads the new one from its next request, and a request that was
        routed by the old one keeps the spec it was given (see :meth:`replicas`)."""
        models = tuple(models)
        enabled = tuple(m for m in models if m.entry.enabled)
        by_id: dict[str, list[ModelSpec]] = {}
        groups: dict[int, list[ModelSpec]] = {}
        for spec in enabled:
            groups.setdefault(spec.index, []).append(spec)
            if spec.replica == 1:
                by_id.setdefault(spec.entry.id, []).append(spec)
        # Aliases lead to their entry; one that is also an id or another alias is refused
        # when the registry is loaded, and the ids win here if one gets through anyway.
        by_alias: dict[str, ModelSpec] = {}
        for spec in enabled:
            if spec.replica == 1:
                for name in spec.entry.alias_names:
                    if name not in by_id:
                        by_alias.setdefault(name, spec)
        self.models = models
        self.enabled = enabled
        # Its specs by identity (a spec a request holds is alive, so its id is its own).
        self._held = frozenset(id(spec) for spec in models)
        self._by_id = by_id
        self._by_alias = by_alias
        self._replicas: dict[int, tuple[ModelSpec, ...]] = {
            index: tuple(specs) for index, specs in groups.items()
        }
        # The enabled entries, each by its first replica: one per model id unless ambiguous.
        self.entries = tuple(s for s in enabled if s.replica == 1)
        # Where /infill requests that name no model go (the registry allows one).
        self.infill_default = next((s for s in self.entries if s.entry.infill_default), None)

    def holds(self, spec: ModelSpec) -> bool:
        """Whether ``spec`` is one of this registry's (not one a request was routed by
        before :meth:`replace`)."""
        return id(spec) in self._held

    def replicas(self, spec: ModelSpec) -> tuple[ModelSpec, ...]:
        """Every replica of ``spec``'s entry (``spec`` itself alone for one replica),
        the entries that join it with ``replica_of`` after its own. A spec the registry
        no longer holds (a request routed before :meth:`replace`) is alone: positions
        in a file that was replaced name other entries."""
        group = self._replicas.get(spec.index)
        if group is None:
            return (spec,)
        for member in group:
            if member is spec:
                return group
        return (spec,)

    def size(self, spec: ModelSpec) -> int:
        """How many replicas ``spec``'s model has: its entry's and those joining it."""
        return len(self.replicas(spec))

    def named(self, name: str) -> str:
        """``name`` as the registry knows it: an Ollama client's ``<name>:latest`` (its
        default tag, which Ollama's clients add to a bare name) is ``<name>`` when no
        entry or alias is called ``<name>:latest`` itself."""
        if name.endswith(LATEST) and name not in self._by_alias and name not in self._by_id:
            return name[: -len(LATEST)]
        return name

    def alias(self, name: str) -> str | None:
        """``name`` when it is an alias (of the entry :meth:`lookup` gives), else None."""
        name = self.named(name)
        return name if name in self._by_alias else None

    def lookup(self, model_id: str) -> ModelSpec:
        """The one enabled entry with this id or alias (:meth:`named`), by its first
        replica; 404 if none, 409 if several entries have the id."""
        model_id = self.named(model_id)
        aliased = self._by_alias.get(model_id)
        if aliased is not None:
            return aliased
        found = self._by_id.get(model_id)
        if not found:
            known = ", ".join(sorted([*self._by_id, *self._by_alias])) or "none"
            raise ModelNotFound(
                f"The model '{model_id}' does not exist or is not enabled (known: {known})",
                param="model",
            )
        if len(found) > 1:
            roles = ", ".join(repr(s.role) for s in found)
            raise AmbiguousModel(
                f"The model id '{model_id}' is used by several enabled entries ({roles}); "
                "give each a unique id in the registry",
                param="model",
            )
        return found[0]

    def default_model(self) -> str:
        """The id of the model a request that names none goes to, where its shape
        allows (``/infill``: the entry with ``infill_default: true``); 400 when no
        enabled entry is the default."""
        if self.infill_default is None:
            raise InvalidRequest(
                "The request has no 'model' field and no model of the registry is the "
                "default for it (infill_default: true); name one of GET /v1/models",
                code="missing_model",
                param="model",
            )
        return self.infill_default.entry.id

    def route(self, model_id: str, shape: Shape | None) -> ModelSpec:
        """The entry for ``model_id``, checked to serve ``shape`` (None: unchecked)."""
        spec = self.lookup(model_id)
        if shape is not None and spec.entry.model_type not in shape.model_types:
            allowed = " or ".join(sorted(shape.model_types))
            raise UnsupportedEndpoint(
                f"The model '{model_id}' has model_type '{spec.entry.model_type}', "
                f"which does not serve {shape.path} (that needs {allowed})",
                param="model",
            )
        return spec

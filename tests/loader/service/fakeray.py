"""A stand-in for the few ``ray`` calls the service's client makes, in this process: actors are
plain objects, a task runs when its result is asked for, and a test decides which worker dies
after how many batches, which never starts and which stalls. It lets the client's window, order
and fault handling be tested in milliseconds; the cluster tests check the same against Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardkit.loader.service.actor import BatchActor, Started


class RayError(Exception):
    pass


class RayTaskError(RayError):
    pass


class GetTimeoutError(RayError):
    pass


class ActorDiedError(RayError):
    pass


class _Exceptions:
    RayError, RayTaskError, GetTimeoutError, ActorDiedError = RayError, RayTaskError, GetTimeoutError, ActorDiedError


@dataclass(eq=False)
class FakeActor:
    index: int
    actor: BatchActor
    builds_left: int | None = None  # dies when it reaches 0 (None: never)
    placed: bool = True  # False: never starts (no CPU for it)
    stalls: bool = False  # its batches never come
    dead: bool = False
    built: int = 0


@dataclass(eq=False)
class FakeRef:
    owner: FakeActor
    method: str
    args: tuple[Any, ...]
    done: bool = False
    value: Any = None
    cancelled: bool = False


class _Method:
    def __init__(self, ray: FakeRay, actor: FakeActor, name: str) -> None:
        self.ray, self.actor, self.name = ray, actor, name

    def remote(self, *args: Any) -> FakeRef:
        ref = FakeRef(self.actor, self.name, args)
        if self.name == "build":
            self.ray.outstanding.add(id(ref))
            self.ray.most_outstanding = max(self.ray.most_outstanding, len(self.ray.outstanding))
        return ref


class _Handle:
    def __init__(self, ray: FakeRay, actor: FakeActor) -> None:
        self._actor = actor
        self.start, self.build = _Method(ray, actor, "start"), _Method(ray, actor, "build")


class _ActorClass:
    def __init__(self, ray: FakeRay) -> None:
        self.ray = ray

    def options(self, **options: Any) -> _ActorClass:
        self.ray.options = options
        return self

    def remote(self, *args: Any) -> _Handle:
        ray = self.ray
        plan = ray.plans.pop(0) if ray.plans else {}
        actor = FakeActor(len(ray.actors), BatchActor(*args), **plan)
        ray.actors.append(actor)
        return _Handle(ray, actor)


@dataclass(eq=False)
class FakeRay:
    """``plans``: keyword arguments of :class:`FakeActor` for the next actors started, in order."""

    cpus: float = 8
    plans: list[dict[str, Any]] = field(default_factory=list)
    actors: list[FakeActor] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    outstanding: set[int] = field(default_factory=set)  # build refs asked for, not taken or cancelled
    most_outstanding: int = 0
    cancelled: int = 0
    exceptions = _Exceptions

    def remote(self, cls: type) -> _ActorClass:
        assert cls is BatchActor
        return _ActorClass(self)

    def is_initialized(self) -> bool:
        return True

    def put(self, value: Any) -> Any:
        return value

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": self.cpus}

    def kill(self, handle: _Handle, no_restart: bool = True) -> None:
        handle._actor.dead = True

    def cancel(self, ref: FakeRef) -> None:
        ref.cancelled = True
        self.cancelled += 1
        self.outstanding.discard(id(ref))

    def wait(self, refs: list[FakeRef], num_returns: int = 1, timeout: float | None = None
             ) -> tuple[list[FakeRef], list[FakeRef]]:
        ready = [r for r in refs if r.owner.placed]
        return ready, [r for r in refs if not r.owner.placed]

    def get(self, ref: FakeRef, timeout: float | None = None) -> Any:
        actor = ref.owner
        if not ref.done:
            if actor.dead or not actor.placed:
                raise ActorDiedError(f"actor {actor.index} died")
            if ref.method == "start":
                ref.value = Started(f"node-{actor.index}", 1000 + actor.index, actor.actor.check())
            else:
                if actor.stalls:
                    raise GetTimeoutError("timed out")
                if actor.builds_left == 0:
                    actor.dead = True
                    raise ActorDiedError(f"actor {actor.index} died")
                if actor.builds_left is not None:
                    actor.builds_left -= 1
                try:
                    ref.value = actor.actor.build(*ref.args)
                except Exception as err:
                    raise RayTaskError(f"{type(err).__name__}: {err}") from err
                actor.built += 1
            ref.done = True
        self.outstanding.discard(id(ref))
        return ref.value

"""Pytest fixtures over localcloud's fake of Vertex AI (localcloud/vertex.py) and the trainer image stand-in.

A test module enables them with `pytest_plugins = ["tests.fake_vertex"]`; the Cloud Storage emulator's fixtures
(tests/gcs_emulator.py) are always on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localcloud.image import TRAINER_IMAGE, project_sdist
from localcloud.vertex import FakeVertex

__all__ = ["TRAINER_IMAGE"]


@pytest.fixture(scope="session")
def sdist_path(tmp_path_factory) -> Path:
    """The project's sdist, built once per session with localcloud.image.build_sdist."""
    return project_sdist(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def trainer_image_python(sdist_path) -> Path:
    """The stand-in of the image docker/Dockerfile builds (localcloud/image.py), cached by the sdist's content."""
    from localcloud.image import trainer_image_python as build

    return build(sdist_path)


@pytest.fixture
def fake_vertex(gcs_emulator) -> Iterator[FakeVertex]:
    """A fake that accepts jobs and keeps them pending (no training runs)."""
    fake = FakeVertex()
    yield fake
    fake.close()


@pytest.fixture
def make_fake_vertex(gcs_emulator) -> Iterator[Callable[..., FakeVertex]]:
    """FakeVertex(**kwargs) for tests that need another set-up; each is closed after the test."""
    fakes: list[FakeVertex] = []

    def make(**kwargs) -> FakeVertex:
        fakes.append(FakeVertex(**kwargs))
        return fakes[-1]

    yield make
    for fake in fakes:
        fake.close()
        for name, job in fake.jobs.items():  # pytest shows this only when the test failed
            if job.log:
                print(f"--- {name}, {job.proto.state.name}: the replicas' log ---\n{job.log}")


@pytest.fixture
def fake_vertex_runner(make_fake_vertex, trainer_image_python) -> FakeVertex:
    """A fake that runs jobs, with the trainer image registered under TRAINER_IMAGE."""
    fake = make_fake_vertex(run_jobs=True)
    fake.register_image(TRAINER_IMAGE, trainer_image_python)
    return fake

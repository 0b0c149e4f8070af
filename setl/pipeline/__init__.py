"""Pipeline assembly, between the connectors and the scheduler: a pipeline's stages built by their
connectors (`build`) and wrapped in the one chain (`chain`). `setl.node.Node` and the CLI both
assemble pipelines here; nothing below this floor imports it."""

from setl.pipeline.build import (
    analyse_steps,
    build_actions,
    build_load,
    build_select,
    build_stages,
    build_transform,
    describe_tables,
    table_creation,
    table_creator,
)
from setl.pipeline.chain import DdlTaskWrap, LoadWrap, Stages, compose, fenced

__all__ = ["DdlTaskWrap", "LoadWrap", "Stages", "analyse_steps", "build_actions", "build_load", "build_select",
           "build_stages", "build_transform", "compose", "describe_tables", "fenced", "table_creation",
           "table_creator"]

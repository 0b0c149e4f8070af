"""The four stage contracts of a pipeline: Select, Extract, Transform and Load."""

from setl.stages.extract import Extract, TableExtract
from setl.stages.load import Load, LoadCapabilities, LoadWrapper
from setl.stages.select import Select, SelectCapabilities, SelectWrapper
from setl.stages.transform import Transform

__all__ = ["Select", "SelectCapabilities", "SelectWrapper", "Extract", "TableExtract", "Transform", "Load",
           "LoadCapabilities", "LoadWrapper"]

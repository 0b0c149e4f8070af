"""The four stage contracts of a pipeline: Select, Extract, Transform and Load."""

from setl.stages.extract import Extract, TableExtract
from setl.stages.load import Load
from setl.stages.select import Select
from setl.stages.transform import Transform

__all__ = ["Select", "Extract", "TableExtract", "Transform", "Load"]

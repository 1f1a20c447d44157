"""Ray Data's preprocessors (``ray.data.preprocessors``): fitted on the
driver over the whole data set, applied in the ranks as each reads its
share (``transform`` adds a ``map_batches`` step), saved with a checkpoint
through ``serialize()``. The others of Ray's are refused by name, when used."""

from ..preprocessor import Preprocessor, PreprocessorNotFittedException
from .chain import Chain
from .concatenator import Concatenator
from .encoder import LabelEncoder, OneHotEncoder, OrdinalEncoder
from .imputer import SimpleImputer
from .normalizer import Normalizer
from .scaler import MaxAbsScaler, MinMaxScaler, RobustScaler, StandardScaler

__all__ = ["Chain", "Concatenator", "LabelEncoder", "MaxAbsScaler", "MinMaxScaler", "Normalizer", "OneHotEncoder", "OrdinalEncoder",
           "Preprocessor", "PreprocessorNotFittedException", "RobustScaler", "SimpleImputer", "StandardScaler"]

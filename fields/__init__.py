"""fields: exact probabilistic equivalence checking over Z_p × Z_q (Schwartz–Zippel, with exp)."""

from fields.algebra import FieldAlgebra as FieldAlgebra
from fields.array import FieldArray as FieldArray
from fields.degree import DegreeAlgebra as DegreeAlgebra
from fields.degree import DegreeReport as DegreeReport
from fields.degree import degree_bound as degree_bound
from fields.memory import TooLarge as TooLarge
from fields.memory import trial_bytes as trial_bytes
from fields.numbers import Field as Field
from fields.numbers import FieldSemanticsError as FieldSemanticsError
from fields.numbers import VoidTrial as VoidTrial
from fields.numbers import default_field as default_field
from fields.numbers import find_field as find_field
from fields.numbers import matmul_mod as matmul_mod
from fields.numbers import to_residues as to_residues
from fields.verify import Verdict as Verdict
from fields.verify import evaluate as evaluate
from fields.verify import known as known
from fields.verify import random_inputs as random_inputs
from fields.verify import remember as remember
from fields.verify import run_trial as run_trial
from fields.verify import trial_bound as trial_bound
from fields.verify import verify as verify
from fields.verify import verify_plan as verify_plan
from fields.verify import verify_to_bound as verify_to_bound

# Contains deepspeed specific functions
from .helper import *
"""acchead: SpecDec++ acceptance-prediction heads."""

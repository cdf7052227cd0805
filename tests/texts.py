"""Hand-written text that test corpora share: prose every funnel stage keeps."""

# Six sentences of plain English that pass language ID, every Gopher/C4/FineWeb rule and PII.
PROSE = (
    "The harbour town wakes slowly when the fishing boats return with the morning tide. "
    "Traders set out their stalls along the quay and argue about the price of fresh mackerel. "
    "Children run between the nets while their parents count the catch and mend the torn ropes. "
    "By noon the market is loud with voices, and the smell of salt and smoke drifts over the water. "
    "Visitors who come for a single day often stay for a week, charmed by the narrow streets. "
    "In the evening the lamps are lit and the old sailors tell stories that grow longer every year."
)

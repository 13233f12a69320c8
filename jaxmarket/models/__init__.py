"""External models of the market (:data:`~jaxmarket.models.base.MODELS`) and the POI
fields that steer exploration by them (:data:`~jaxmarket.models.poi.POI_FIELDS`).

Importing the package (any of its modules) registers every shipped kind: ``demand``,
``reward`` (:mod:`~jaxmarket.models.demand`), ``rival`` (:mod:`~jaxmarket.models.rival`)
and the POI fields of :mod:`~jaxmarket.models.poi`.
"""

from jaxmarket.models import base, demand, poi, rival  # noqa: F401  (registration)

"""Page-number pagination that refuses what its schema does not allow (400 naming the parameter),
instead of DRF's silent fallbacks (a bad page_size meant the default, an empty page the first)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response

MAX_PAGE_SIZE = 500
# A page number past any real one (also keeps int() far from its digit limit).
MAX_PAGE = 10**9
ERR_PAGE_INTEGER = "Must be an integer between {low} and {high}."


def _bounded_int(params: Any, name: str, low: int, high: int) -> int | None:
    if name not in params:
        return None
    raw = params.get(name, "")
    text = raw.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if digits.isascii() and digits.isdigit() and len(digits) <= 12:
        value = int(text)
        if low <= value <= high:
            return value
    raise ValidationError({name: [ERR_PAGE_INTEGER.format(low=low, high=high)]})


# A list is counted no further than this many rows (``count_capped`` says when it stopped).
COUNT_CAP = 10_000


def capped_count(rows: QuerySet, cap: int) -> int:
    """How many ``rows`` there are, counted no further than ``cap`` + 1 (SELECT COUNT(*) FROM
    (SELECT id ... LIMIT cap + 1)): more than ``cap`` when it returns cap + 1."""
    return rows.order_by().values("pk")[: cap + 1].count()


class CappedCountPaginator(Paginator):
    """Counts no further than ``cap`` rows (default COUNT_CAP): a count of ten million runs read
    every one of them, 2.5 s a page on MariaDB. Past the cap the filters, not the page numbers,
    reach the other rows. Used by the API's lists and the dashboard's."""

    def __init__(self, object_list: QuerySet, per_page: int, *, cap: int | None = None) -> None:
        super().__init__(object_list, per_page)
        self.cap = COUNT_CAP if cap is None else cap

    @cached_property
    def seen(self) -> int:
        return capped_count(self.object_list, self.cap)

    @cached_property
    def count(self) -> int:
        return min(self.seen, self.cap)

    @property
    def capped(self) -> bool:
        return self.seen > self.cap


class Pagination(PageNumberPagination):
    django_paginator_class = CappedCountPaginator
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    last_page_strings = ()

    def get_page_size(self, request: Any) -> int:
        size = _bounded_int(request.query_params, self.page_size_query_param, 1, MAX_PAGE_SIZE)
        return self.page_size if size is None else size

    def get_page_number(self, request: Any, paginator: Any) -> int:
        number = _bounded_int(request.query_params, self.page_query_param, 1, MAX_PAGE)
        return 1 if number is None else number

    def get_paginated_response(self, data: Any) -> Response:
        response = super().get_paginated_response(data)
        response.data["count_capped"] = self.page.paginator.capped
        return response

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        described = super().get_paginated_response_schema(schema)
        described["properties"]["count"]["description"] = (
            f"How many match, counted up to {COUNT_CAP:,} (see count_capped)."
        )
        described["properties"]["count_capped"] = {
            "type": "boolean",
            "description": f"True when more than {COUNT_CAP:,} match: count is then {COUNT_CAP:,} "
            "and the pages reach the first of them (narrow the filters for the rest).",
        }
        described["required"] = [*described.get("required", []), "count_capped"]
        return described

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        page, size = super().get_schema_operation_parameters(view)
        page["schema"].update(minimum=1, maximum=MAX_PAGE)
        page["description"] += " Past the last page: 404."
        size["schema"].update(minimum=1, maximum=MAX_PAGE_SIZE, default=self.page_size)
        return [page, size]

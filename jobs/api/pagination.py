"""Page-number pagination that refuses what its schema does not allow (400 naming the parameter),
instead of DRF's silent fallbacks (a bad page_size meant the default, an empty page the first)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination

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


class Pagination(PageNumberPagination):
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

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        page, size = super().get_schema_operation_parameters(view)
        page["schema"].update(minimum=1, maximum=MAX_PAGE)
        page["description"] += " Past the last page: 404."
        size["schema"].update(minimum=1, maximum=MAX_PAGE_SIZE, default=self.page_size)
        return [page, size]

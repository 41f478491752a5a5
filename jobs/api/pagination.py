from rest_framework.pagination import PageNumberPagination

MAX_PAGE_SIZE = 500


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def pool_list(request: HttpRequest) -> HttpResponse:
    return render(request, "workers/pool_list.html")

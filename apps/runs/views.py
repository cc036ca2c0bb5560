from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def playground(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/playground.html")


def run_list(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/run_list.html")

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def event_list(request: HttpRequest) -> HttpResponse:
    return render(request, "audit/event_list.html")

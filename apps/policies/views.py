from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def policy_list(request: HttpRequest) -> HttpResponse:
    return render(request, "policies/policy_list.html")

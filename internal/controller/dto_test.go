package controller

import dto "github.com/prometheus/client_model/go"

type dtoMetric = dto.Metric

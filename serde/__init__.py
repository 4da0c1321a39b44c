"""Decoders for Kafka keys and values; knows nothing of Spark.

>>> from kwatermark.serde import make_deserializer
>>> decoder = make_deserializer("value", {"value.format": "string"})
>>> decoder.decode([b"hello", None]).array.to_pylist()
['hello', None]
"""

from .arrowtypes import avro_to_arrow_type
from .avro import AvroDeserializer, ConfluentAvroDeserializer
from .base import DecodedBatch, Deserializer, SerdeError
from .formats import FORMATS, make_deserializer
from .jsonschema import ConfluentJsonSchemaDeserializer, json_schema_arrow_type
from .jsonvalues import JsonDeserializer
from .protobuf import ConfluentProtobufDeserializer, protobuf_arrow_type
from .text import StringDeserializer

__all__ = [
    "FORMATS",
    "AvroDeserializer",
    "ConfluentAvroDeserializer",
    "ConfluentJsonSchemaDeserializer",
    "ConfluentProtobufDeserializer",
    "DecodedBatch",
    "Deserializer",
    "JsonDeserializer",
    "SerdeError",
    "StringDeserializer",
    "avro_to_arrow_type",
    "json_schema_arrow_type",
    "make_deserializer",
    "protobuf_arrow_type",
]

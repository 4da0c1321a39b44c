"""Protobuf messages for tests, built at run time from descriptors (no protoc).

``file_messages(text)`` turns a ``FileDescriptorProto`` in protobuf text format into message
classes that confluent-kafka's ``ProtobufSerializer`` accepts.
"""

from __future__ import annotations

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    text_format,
    timestamp_pb2,
)

ORDERS_V1 = """
name: "orders.proto" package: "shop" syntax: "proto3"
dependency: "google/protobuf/timestamp.proto"
message_type {
  name: "Order"
  field { name: "id" number: 1 label: LABEL_OPTIONAL type: TYPE_INT64 }
  field { name: "at" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".google.protobuf.Timestamp" }
  field { name: "status" number: 3 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".shop.Status" }
  field { name: "tags" number: 4 label: LABEL_REPEATED type: TYPE_STRING }
  field { name: "counts" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".shop.Order.CountsEntry" }
  field { name: "item" number: 6 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".shop.Item" }
  nested_type {
    name: "CountsEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 }
  }
}
message_type {
  name: "Item"
  field { name: "sku" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "price" number: 2 label: LABEL_OPTIONAL type: TYPE_DOUBLE }
}
enum_type {
  name: "Status"
  value { name: "NEW" number: 0 } value { name: "PAID" number: 1 }
  value { name: "SHIPPED" number: 2 }
}
"""

# V1 plus a field: the latest schema a reader of V1 data uses (evolution by field number).
ORDERS_V2 = ORDERS_V1.replace(
    '''type_name: ".shop.Item" }''',
    '''type_name: ".shop.Item" }
  field { name: "note" number: 7 label: LABEL_OPTIONAL type: TYPE_STRING }''', 1)


def file_messages(text: str) -> dict[str, type]:
    """Message classes by short name of the file described by ``text``, each in a pool of
    its own (V1 and V2 of one file can live side by side)."""
    proto = text_format.Parse(text, descriptor_pb2.FileDescriptorProto())
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    file = pool.AddSerializedFile(proto.SerializeToString())
    return {name: message_factory.GetMessageClass(desc)
            for name, desc in file.message_types_by_name.items()}


# Two files: the order imports its item from another file, which confluent-kafka's
# serializer registers as a schema reference (subject "shop/item.proto").
ITEM_FILE = """
name: "shop/item.proto" package: "shop" syntax: "proto3"
message_type {
  name: "Item"
  field { name: "sku" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
}
"""
ORDER_WITH_IMPORT = """
name: "shop/order.proto" package: "shop" syntax: "proto3"
dependency: "shop/item.proto"
message_type {
  name: "Order"
  field { name: "id" number: 1 label: LABEL_OPTIONAL type: TYPE_INT64 }
  field { name: "items" number: 2 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".shop.Item" }
}
"""


def files_messages(*texts: str) -> dict[str, type]:
    """Like :func:`file_messages` for several files in one pool, dependencies first: the
    message classes of the last file."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    file = None
    for text in texts:
        proto = text_format.Parse(text, descriptor_pb2.FileDescriptorProto())
        file = pool.AddSerializedFile(proto.SerializeToString())
    return {name: message_factory.GetMessageClass(desc)
            for name, desc in file.message_types_by_name.items()}
